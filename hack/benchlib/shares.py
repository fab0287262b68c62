"""DRA shares (`sharing.shares`) on the bundled node with `mps: {available: true}`, whose
MPS control program is the simulator's twin of nvidia-cuda-mps-control: a share's
prepare beside a whole GPU's in interleaved rounds of one run, agent start -> first
share served, and 100 shares prepared and unprepared in cycles (hack/benchlib/
share_cycles.py). The stand-ins are dra.py's; the agent is a real process."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from agents.sim.bundled import DEMO_NODE, bundled_node
from agents.sim.mps_control import PID_FILE
from hack.benchlib.agent import AgentProcess, no_collection, percentile
from hack.benchlib.dra import GPU, NODE, WITHIN_S, Bench, Moment
from hack.benchlib.figures import Figure, below, info, skipped
from hack.benchlib.share_cycles import cycle_figures

RATIO_LIMIT = 1.2  # a share's prepare p50 at most this times a whole GPU's
WARMUP = 10  # rounds before the clock starts
SHARE = {"memory": "3Gi", "compute": "4"}  # 25 of them fit an 80 GB H100, 100 % of SMs
MPS_ROOT = Path("run/nvidia/mps")  # flags.mpsRoot's default, under the simulated root
TWIN = "agents.sim.mps_control"  # in the command line of the twin's daemon
Obj = dict[str, Any]
Call = Callable[[str, list[tuple[str, str, str]]], Awaitable[Any]]


class SharedNode:
    """dra.py's stand-ins and the agent with `sharing.shares`, its GPU family alone (no
    NIC work beside the figures), its simulated tree under `<work>/sim` so that the MPS
    pipe directory is known; the twin daemons it started."""

    def __init__(self, bench: Bench) -> None:
        self.bench = bench
        self.sim = bench.work / "sim"
        self.twins: set[int] = set()  # daemons seen, to end when done (they outlive agents)
        self.agent: AgentProcess | None = None
        self.log_start = 0  # the size of the agents' log when the latest one started

    @property
    def pipe(self) -> Path:
        return self.sim / "node-agent-sim" / MPS_ROOT / GPU / "pipe"

    async def start(self, enforce: str, wait_slices: bool = True) -> AgentProcess:
        """An agent with shares enforced so, once its GPU driver is registered (and, with
        `wait_slices`, its GPUs published as shared)."""
        config = {"version": "v1", "sharing": {"shares": {"enforce": enforce}}}
        serial = getattr(self.bench.watcher.drivers.get(GPU), "serial", 0)
        if wait_slices:
            shared = Moment(self.bench.server, self._shared)
        more = ["--simulate-root", str(self.sim), "--families", "gpu"]
        agent = self.bench.agent(config, more)
        self.agent = agent
        log = self.bench.work / "agent.log"
        self.log_start = log.stat().st_size if log.exists() else 0
        agent.start()
        await self.bench.watcher.registered(GPU, WITHIN_S, after=serial)
        if wait_slices:
            await shared.wait()
        return agent

    def _shared(self) -> bool:
        devices = self.bench.devices(GPU).values()
        return bool(devices) and all(d.get("allowMultipleAllocations") for d in devices)

    async def stop(self) -> None:
        agent, self.agent = self.agent, None
        if agent is None:
            return
        self.note_twin()
        code = agent.stop()
        if code != 0:
            raise RuntimeError(f"the DRA agent exited with {code}")
        await self.bench.watcher.gone(GPU, WITHIN_S)

    def note_twin(self) -> int | None:
        """The twin daemon serving the pipe directory now, if one does; remembered."""
        try:
            pid = int((self.pipe / PID_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not _is_twin(pid):
            return None
        self.twins.add(pid)
        return pid

    def end_twins(self) -> None:
        """End the twin daemons seen (by PID, each checked to be the twin still)."""
        for pid in sorted(self.twins):
            if _is_twin(pid):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + WITHIN_S
        while any(_is_twin(p) for p in self.twins) and time.monotonic() < deadline:
            time.sleep(0.01)  # polling a process not ours to wait for, with a deadline
        self.twins.clear()

    def claim(self, uid: str, gpus: Sequence[str], share: bool) -> tuple[str, str, str]:
        """A claim of `gpus`, each whole or one share of SHARE; the kubelet's reference."""
        entries = []
        for i, gpu in enumerate(gpus):
            entry: Obj = {"request": f"r{i}", "driver": GPU, "pool": NODE, "device": gpu}
            if share:
                entry["shareID"] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"{uid}/{i}"))
                entry["consumedCapacity"] = dict(SHARE)
            entries.append(entry)
        self.bench.server.store.put_claim("ns", f"c-{uid}", uid, entries)
        return ("ns", uid, f"c-{uid}")

    def env(self, uid: str) -> dict[str, str]:
        """The environment of claim `uid`'s CDI spec."""
        spec = yaml.safe_load((self.bench.work / "cdi" / f"k8s.{GPU}-claim_{uid}.yaml").read_text())
        [entry] = [d for d in spec["devices"] if d["name"] == f"{uid}-env"]
        return dict(e.split("=", 1) for e in entry["containerEdits"]["env"])


def _is_twin(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z" and TWIN.encode() in command


async def timed(call: Call, ref: tuple[str, str, str]) -> float:
    """One call for one claim, in ms; a per-claim error raises."""
    started = time.perf_counter()
    answer = await call(GPU, [ref])
    took = (time.perf_counter() - started) * 1000
    if error := answer.claims[ref[1]].error:
        raise RuntimeError(f"claim {ref[1]}: {error}")
    return took


WHOLE, JOINING, FIRST = "whole GPU", "share joining shares", "first share of a GPU"


async def share_beside_whole(node: SharedNode, n: int, tag: str) -> dict[str, list[float]]:
    """`n` interleaved rounds (the order rotating), each preparing then unpreparing: a
    whole GPU (GPUs 4-7 in turn), a share of a GPU that holds another claim's share all
    along (GPUs 0-1: the common case on a busy node) and the first share of a GPU (2-3:
    under MPS it goes to EXCLUSIVE_PROCESS and back). Each arm's prepare times in ms."""
    gpus = sorted(node.bench.devices(GPU))
    arms = {WHOLE: gpus[4:8], JOINING: gpus[0:2], FIRST: gpus[2:4]}
    held = node.claim(f"{tag}-held", gpus[0:2], share=True)
    await timed(node.bench.kubelet.prepare, held)
    ms: dict[str, list[float]] = {arm: [] for arm in arms}
    order = list(arms)
    with no_collection():
        for i in range(WARMUP + n):
            for arm in order[i % 3 :] + order[: i % 3]:
                on = arms[arm][i % len(arms[arm])]
                ref = node.claim(f"{tag}-{i}{arm[0]}", [on], arm != WHOLE)
                took = await timed(node.bench.kubelet.prepare, ref)
                await timed(node.bench.kubelet.unprepare, ref)
                if i >= WARMUP:
                    ms[arm].append(took)
    await timed(node.bench.kubelet.unprepare, held)
    return ms


def ratio_figures(ms: dict[str, list[float]], enforce: str) -> list[Figure]:
    whole = percentile(ms[WHOLE], 50)
    note = (
        f"{len(ms[WHOLE])} interleaved rounds, each preparing then unpreparing a whole-GPU "
        f"claim, a one-share claim ({SHARE['memory']}, compute {SHARE['compute']}) of a GPU "
        "that holds another share all along, and one of a GPU that holds none; same agent"
    )
    figures = []
    for arm in (JOINING, FIRST):
        name = f"{arm} / whole-GPU prepare p50 (enforce: {enforce})"
        ratio = round(percentile(ms[arm], 50) / whole, 3)
        if enforce == "mps":
            figures.append(below(name, ratio, "x", RATIO_LIMIT, note))
        else:
            figures.append(info(name, ratio, "x", note and note + "; no MPS: no variables"))
        note = ""
    for arm in (WHOLE, JOINING, FIRST):
        for q in (50, 99):
            name = f"NodePrepareResources {arm} p{q} (enforce: {enforce})"
            figures.append(info(name, percentile(ms[arm], q), "ms"))
    return figures


async def first_share(node: SharedNode, starts: int) -> list[Figure]:
    """Agent start -> a share's prepare answered, the kubelet calling as soon as the driver
    registers; no MPS daemon before each start. Whether the agent had its daemon (the
    twin) answering by then, started before the answer."""
    ms: list[float] = []
    daemon_first = 0
    for run in range(starts):
        node.end_twins()
        ref = node.claim(f"first-{run}", ["gpu-0"], share=True)
        agent = await node.start("mps", wait_slices=False)
        await timed(node.bench.kubelet.prepare, ref)
        answered = time.monotonic(), time.time()
        ms.append((answered[0] - agent.started_at) * 1000)
        pid = node.note_twin()
        if pid is not None and (node.pipe / PID_FILE).stat().st_mtime <= answered[1]:
            daemon_first += 1
        if "CUDA_MPS_PIPE_DIRECTORY" not in node.env(ref[1]):
            raise RuntimeError("a share under enforce: mps was not told MPS's pipe directory")
        await timed(node.bench.kubelet.unprepare, ref)
        await node.stop()
    node.end_twins()
    note = (
        f"spawn of `node-agent run --api dra` to the first share's NodePrepareResources "
        f"answered, {starts} starts, no MPS daemon running before each; the kubelet stand-in "
        "calls once the driver registers (its watcher polls every 50 ms). The daemon is the "
        "simulator's twin of nvidia-cuda-mps-control (a Python program), not the driver's"
    )
    name = "agent start -> first share served, MPS twin daemon"
    figures = [info(f"{name}, median", percentile(ms, 50), "ms", note)]
    figures.append(info(f"{name}, max", max(ms), "ms"))
    label = "MPS daemon (twin) up before the first share answered"
    if daemon_first == 0:
        figures.append(
            skipped(
                label,
                f"{starts} of {starts}",
                "not measurable yet: no daemon was "
                "started for shares by the agent (their limits are told, unenforced)",
            )
        )
    else:
        figures.append(
            Figure(
                label,
                float(daemon_first),
                f"of {starts}",
                f"{starts} of {starts}",
                daemon_first == starts,
            )
        )
    return figures


async def shares_figures(work: Path, samples: int, starts: int, cycles: int) -> list[Figure]:
    node_file = work / "node.yaml"
    doc: Obj = yaml.safe_load(bundled_node(DEMO_NODE).read_text())
    doc["mps"] = {"available": True}
    node_file.write_text(yaml.safe_dump(doc))
    (work / "dra").mkdir()
    async with Bench(work / "dra", node_file) as bench:
        node = SharedNode(bench)
        try:
            figures = await first_share(node, starts)
            agent = await node.start("mps")
            figures += ratio_figures(await share_beside_whole(node, samples, "mps"), "mps")
            figures += await cycle_figures(node, agent, cycles)
            await node.stop()
            await node.start("none")
            figures += ratio_figures(await share_beside_whole(node, samples, "none"), "none")
        finally:
            if node.agent is not None:
                node.note_twin()
                node.agent.stop()
            node.end_twins()
    return figures
