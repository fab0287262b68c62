"""`hack/bench`: every figure of the benchmark issue, as a table or as JSON."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import structlog

from agents.sim.bundled import DEMO_NODE, bundled_node
from hack.benchlib import (
    apiserver,
    busy,
    degraded,
    dra,
    fabric,
    faults,
    floor,
    idle_nvml,
    latency,
    lifecycle,
    metrics_cost,
    nvml_hang,
    pairing,
    shares,
)
from hack.benchlib.agent import GPU, NIC
from hack.benchlib.figures import Figure, as_json, table
from hack.benchlib.nodes import generate_node, sharing_config, write_yaml


def machine() -> dict[str, str]:
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return {
        "cpus": str(os.cpu_count()),
        "cpu": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def latency_figures(root: Path, n: int) -> list[Figure]:
    figures: list[Figure] = []
    work = root / "lat-8gpu"
    work.mkdir()
    node = work / "node.yaml"
    shutil.copy(bundled_node(DEMO_NODE), node)
    figures += latency.measure_node(work, node, None, [(GPU, "(8 GPUs)")], n)
    work = root / "lat-replicas"
    work.mkdir()
    node = write_yaml(work / "node.yaml", generate_node(8, 16))
    figures += latency.measure_node(
        work, node, sharing_config(64), [(GPU, "(8x64 replicas)"), (NIC, "(16 NICs)")], n
    )
    work = root / "lat-16gpu"
    work.mkdir()
    node = write_yaml(work / "node.yaml", generate_node(16, 8))
    figures += latency.measure_node(work, node, None, [(GPU, "(16 GPUs)")], n)
    return figures


async def dra_run(work: Path, quick: bool, rest_s: float) -> list[Figure]:
    return await dra.dra_figures(
        work,
        claims=50 if quick else 200,
        starts=3 if quick else 5,
        faults=3 if quick else 5,
        rest_s=rest_s,
    )


async def shares_run(work: Path, quick: bool) -> list[Figure]:
    return await shares.shares_figures(
        work, samples=50 if quick else 250, starts=3 if quick else 5, cycles=3 if quick else 5
    )


async def metrics_run(
    work: Path, quick: bool, rest_s: float, progress: Callable[[str], None]
) -> list[Figure]:
    return await metrics_cost.metrics_figures(work, 50 if quick else 300, rest_s, progress)


def _part(
    only: str,
    root: Path,
    quick: bool,
    *,
    idle_s: float,
    rest_s: float,
    progress: Callable[[str], None],
) -> list[Figure]:
    """The figures of one `--only` choice."""
    parts: dict[str, tuple[str, Callable[[], list[Figure]]]] = {
        "idle-nvml": (
            f"idle on the real NVML backend, {idle_s:g} s",
            lambda: asyncio.run(idle_nvml.idle_nvml(root, idle_s)),
        ),
        "busy": (
            "GetPreferredAllocation on partly occupied nodes",
            lambda: busy.busy_figures(root, 300 if quick else 2000, 100 if quick else 300),
        ),
        "apiserver": (
            "the API server reachable, refused, never answering",
            lambda: apiserver.apiserver_figures(root, 300 if quick else 2000, 5 if quick else 16),
        ),
        "fabric": (
            "the fabric: LLDP frame -> label, malformed frames",
            lambda: fabric.fabric_figures(root, 10 if quick else 50),
        ),
        "dra": (
            f"DRA mode: starts, prepare/unprepare, XID, {rest_s:g} s at rest",
            lambda: asyncio.run(dra_run(root, quick, rest_s)),
        ),
        "shares": (
            "DRA shares: prepare beside a whole GPU, first share, 100 shares in cycles",
            lambda: asyncio.run(shares_run(root, quick)),
        ),
        "metrics": (
            "/metrics beside the same agent without it",
            lambda: asyncio.run(metrics_run(root, quick, rest_s, progress)),
        ),
    }
    step, figures = parts[only]
    progress(step)
    return figures()


def run(
    quick: bool,
    progress: Callable[[str], None],
    only: str | None = None,
    idle_s: float | None = None,
) -> list[Figure]:
    figures: list[Figure] = []
    rest_s = idle_s if idle_s is not None else 10.0 if quick else 60.0
    idle_s = idle_s if idle_s is not None else 5.0 if quick else 30.0
    with tempfile.TemporaryDirectory(prefix="node-agent-bench-") as tmp:
        root = Path(tmp)
        if only is not None:
            return _part(only, root, quick, idle_s=idle_s, rest_s=rest_s, progress=progress)

        def fresh(name: str) -> Path:
            path = root / name
            path.mkdir()
            return path

        progress("start, idle, restarts")
        figures += asyncio.run(lifecycle.lifecycle(fresh("lifecycle"), restarts=20, idle_s=idle_s))
        progress(f"idle on the real NVML backend, {idle_s:g} s")
        figures += asyncio.run(idle_nvml.idle_nvml(fresh("idle-nvml"), idle_s))
        progress("Allocate / GetPreferredAllocation latency")
        figures += latency_figures(root, 300 if quick else 2000)
        progress("GetPreferredAllocation on partly occupied nodes")
        figures += busy.busy_figures(fresh("busy"), 300 if quick else 2000, 100 if quick else 300)
        progress("faults")
        rounds = 5 if quick else 20
        figures += faults.xid_fault(fresh("xid"), rounds)
        figures += faults.link_fault(fresh("link"), rounds)
        progress("the fabric: LLDP frame -> label, malformed frames")
        figures += fabric.fabric_figures(fresh("fabric"), 10 if quick else 50)
        figures += nvml_hang.nvml_hang(fresh("nvml-hang"), 300 if quick else 1000)
        progress("the API server reachable, refused, never answering")
        figures += apiserver.apiserver_figures(fresh("apiserver"), 300 if quick else 2000, rounds)
        progress(f"DRA mode: starts, prepare/unprepare, XID, {rest_s:g} s at rest")
        figures += asyncio.run(dra_run(fresh("dra"), quick, rest_s))
        progress("DRA shares: prepare beside a whole GPU, first share, 100 shares in cycles")
        figures += asyncio.run(shares_run(fresh("shares"), quick))
        figures += asyncio.run(metrics_run(fresh("metrics"), quick, rest_s, progress))
        progress("pairing")
        figures += asyncio.run(pairing.pairing_figures(100 if quick else 500))
        figures.append(pairing.choice_optimality(300 if quick else 3000))
    return figures


def degraded_run(
    quick: bool, progress: Callable[[str], None], idle_s: float | None
) -> list[Figure]:
    cost_s = idle_s if idle_s is not None else 60.0 if quick else 180.0
    with tempfile.TemporaryDirectory(prefix="node-agent-bench-") as tmp:
        return asyncio.run(
            degraded.degraded_figures(Path(tmp), 2 if quick else 5, cost_s, progress)
        )


def floor_figures(
    quick: bool, progress: Callable[[str], None], idle_s: float | None, rounds: int | None
) -> tuple[list[Figure], str]:
    with tempfile.TemporaryDirectory(prefix="node-agent-bench-") as tmp:
        return asyncio.run(
            floor.floor_run(
                Path(tmp),
                rounds=rounds or (1 if quick else 3),
                idle_s=idle_s if idle_s is not None else 10.0 if quick else 30.0,
                calls=300 if quick else 2000,
                xids=5,
                progress=progress,
            )
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/bench", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--quick", action="store_true", help="a short run (CI)")
    parser.add_argument(
        "--only",
        choices=[
            "busy",
            "apiserver",
            "idle-nvml",
            "dra",
            "shares",
            "fabric",
            "floor",
            "degraded",
            "metrics",
        ],
        help="only these figures (busy: GetPreferredAllocation on partly occupied nodes; "
        "apiserver: RPCs and faults with the API server reachable, refused, never answering; "
        "idle-nvml: CPU and threads of an idle agent on the real NVML backend; "
        "dra: `--api dra` on the bundled node: start -> slices, prepare/unprepare, "
        "XID -> out of the slice, RSS and API requests at rest; shares: DRA shares under "
        "MPS (the simulator's twin daemon): a share's prepare beside a whole GPU's, agent "
        "start -> first share, 100 shares prepared and unprepared in cycles without leaks; "
        "fabric: an LLDP frame on a veth -> the leaf group in the feature file, and 1,000 "
        "malformed frames; floor: the agent beside a no-op grpc.aio device plugin, and "
        "beside NVIDIA's plugin, on the simulated node and, with MOCK_NVML_DIR, on NVIDIA's "
        "mock NVML; NVIDIA_DEVICE_PLUGIN names NVIDIA's binary; degraded: each degraded-device "
        "signal injected -> GetPreferredAllocation, the DRA health attribute and the Event, "
        "and back after holdS; idle CPU with every signal probed beside the commit before "
        "them, --idle-s long, default 180 s, 60 s with --quick; metrics: /metrics scrape "
        "time, series, RSS and idle CPU beside the same agent without --metrics-address, "
        "8 GPUs x 48 replicas and 8 NICs all held, at rest --idle-s, default 60 s, 10 quick)",
    )
    parser.add_argument(
        "--rounds", type=int, help="--only floor: rounds of every process (default 3, 1 quick)"
    )
    parser.add_argument(
        "--idle-s",
        type=float,
        help="the idle window in seconds (default 30, 5 with --quick; DRA's window at rest "
        "60, 10 with --quick); an hour: 3600",
    )
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))

    def progress(step: str) -> None:
        print(f"bench: {step} ...", file=sys.stderr, flush=True)

    side = ""
    if args.only == "floor":
        figures, side = floor_figures(args.quick, progress, args.idle_s, args.rounds)
    elif args.only == "degraded":
        figures = degraded_run(args.quick, progress, args.idle_s)
        side = "p50 / max in seconds\n\n" + degraded.per_signal(figures)
    else:
        figures = run(args.quick, progress, args.only, args.idle_s)
    info = machine()
    if args.json:
        print(as_json(figures, info))
    else:
        if side:
            print(side + "\n")
        print(table(figures))
        print(
            f"\n{info['cpus']} CPUs, {info['cpu']}, Python {info['python']}, "
            f"Linux {info['kernel']}{' (--quick)' if args.quick else ''}"
        )
    return 0 if all(f.ok is not False for f in figures) else 1
