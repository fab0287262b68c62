"""A whole agent under the kubelet stand-in: start -> registered, RSS, idle CPU, restarts."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Collection
from functools import partial
from pathlib import Path

from agents.standin.kubelet import Kubelet
from hack.benchlib.agent import GPU, NIC, AgentProcess
from hack.benchlib.figures import Figure, below
from hack.benchlib.nodes import generate_node, sharing_config, write_yaml

MIG = "nvidia.com/mig-1g.10gb"
RESOURCES = (GPU, MIG, NIC)
RSS_LIMIT_MB = 60.0
IDLE_CPU_LIMIT = 0.2  # % of one core
REREGISTER_LIMIT_MS = 300.0
REGISTER_LIMIT_MS = 2000.0  # the first slice's acceptance: registered within 2 s of start


def big_node(work: Path) -> tuple[Path, dict[str, object]]:
    """16 GPUs (2 in MIG mode, 7 slices each), 14 x 40 replicas, 16 NICs: 590 devices."""
    node = write_yaml(work / "node.yaml", generate_node(16, 16, mig_gpus=2))
    return node, sharing_config(40, mig_strategy="mixed")


def _registered_since(kubelet: Kubelet, mark: int, resources: Collection[str]) -> bool:
    fresh = {r.resource_name for r in kubelet.registrations[mark:] if r.error is None}
    if not set(resources) <= fresh:
        return False
    views = [kubelet.resource(name) for name in resources]
    return all(v is not None and v.connected and v.devices for v in views)


def _device_count(kubelet: Kubelet) -> int:
    return sum(kubelet.capacity().values())


async def lifecycle(work: Path, restarts: int, idle_s: float) -> list[Figure]:
    node, config = big_node(work)
    agent = AgentProcess(work, node, config=config)
    kubelet = Kubelet(agent.plugin_dir, seed=1)
    await kubelet.start()
    figures: list[Figure] = []
    try:
        started = time.monotonic()
        agent.start()
        await kubelet.wait_until(lambda k: _registered_since(k, 0, RESOURCES), 30)
        registered_s = time.monotonic() - started
        devices = _device_count(kubelet)
        figures.append(
            below(
                "start -> registered",
                registered_s * 1000,
                "ms",
                REGISTER_LIMIT_MS,
                f"subprocess `node-agent run --simulate`, {devices} devices, 3 resources",
            )
        )
        figures += await _idle(agent, idle_s, devices)
        figures += await _restarts(kubelet, agent, restarts)
    finally:
        code = agent.stop()
        await kubelet.stop()
    figures.append(
        Figure(
            "SIGTERM -> exit 0, sockets removed",
            1.0 if code == 0 else 0.0,
            "",
            "1",
            code == 0 and not list(agent.plugin_dir.glob("node-agent-*.sock")),
        )
    )
    return figures


async def _idle(agent: AgentProcess, idle_s: float, devices: int) -> list[Figure]:
    # Let start-up work settle before the window opens.
    await asyncio.sleep(1.0)
    cpu_before, at_before = agent.cpu_seconds(), time.monotonic()
    await asyncio.sleep(idle_s)
    cpu = agent.cpu_seconds() - cpu_before
    window = time.monotonic() - at_before
    rss_mb = agent.rss_kib() / 1024
    note = f"{devices} devices, all families (whole/replicas, MIG, RoCE)"
    return [
        below("RSS, one process", rss_mb, "MB", RSS_LIMIT_MB, note),
        below(
            "idle CPU",
            cpu / window * 100,
            "%",
            IDLE_CPU_LIMIT,
            f"utime+stime over {window:.0f} s (clock tick 10 ms)",
        ),
    ]


async def _restarts(kubelet: Kubelet, agent: AgentProcess, n: int) -> list[Figure]:
    ms: list[float] = []
    fds = [agent.fd_count()]
    threads = [agent.thread_count()]
    for _ in range(n):
        await kubelet.stop()
        mark = len(kubelet.registrations)
        started = time.monotonic()
        await kubelet.start()
        await kubelet.wait_until(partial(_registered_since, mark=mark, resources=RESOURCES), 10)
        ms.append((time.monotonic() - started) * 1000)
        fds.append(agent.fd_count())
        threads.append(agent.thread_count())
    note = (
        f"{n} stand-in restarts; agent fds {fds[0]}->{fds[-1]}, threads {threads[0]}->{threads[-1]}"
    )
    return [
        below(
            "kubelet restart -> re-registered median",
            statistics.median(ms),
            "ms",
            REREGISTER_LIMIT_MS,
            note,
        ),
        below("kubelet restart -> re-registered max", max(ms), "ms", REREGISTER_LIMIT_MS),
    ]
