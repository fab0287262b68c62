"""DRA mode: a `node-agent run --api dra` process on the bundled node, with the API-server
and kubelet stand-ins in this process: start -> slices, prepare/unprepare round trips,
XID -> out of the slice, memory and API requests at rest (device-plugin mode beside it)."""

from __future__ import annotations

import asyncio
import shutil
import statistics
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from agents.core.node_report import CONDITION_TYPE
from agents.sim.bundled import DEMO_NODE, bundled_node
from agents.standin.kubelet import Kubelet
from hack.benchlib.agent import GPU as DP_GPU
from hack.benchlib.agent import NIC as DP_NIC
from hack.benchlib.agent import AgentProcess, no_collection, percentile
from hack.benchlib.figures import Figure, below, info
from hack.benchlib.lifecycle import IDLE_CPU_LIMIT, REGISTER_LIMIT_MS, RSS_LIMIT_MB
from hack.benchlib.nodes import write_yaml
from tests.standin.apiserver import ApiServer, write_kubeconfig
from tests.standin.dra_kubelet import Claim, DraKubelet, PluginWatcher

NODE = "bench-dra-node"
GPU = "gpu.nvidia.com"
NIC = "roce.node-agents.io"
PREPARE_LIMIT_MS = 100.0  # p99; the kubelet gives each call 45 s
OUT_OF_SLICE_LIMIT_MS = 3000.0  # docs/dra.md: an Unhealthy device leaves its slice within 3 s
WARMUP = 10  # claims prepared and unprepared before the clock starts
SETTLE_S = 1.0  # after the start-up work seen, before a window at rest opens
BOOKMARK_S = 60.0  # a real API server's: an idle watch gets one a minute
WITHIN_S = 30.0  # a process start on a loaded 2-core machine
Obj = dict[str, Any]


class Moment:
    """The first time `condition` holds on the stand-in's store, taken as the change that
    makes it so is stored (the store tells its listeners of every change)."""

    def __init__(self, server: ApiServer, condition: Callable[[], bool]) -> None:
        self._server = server
        self._condition = condition
        self._done = asyncio.Event()
        self.at = 0.0
        server.store.listeners.append(self._check)
        self._check()

    def _check(self) -> None:
        if not self._done.is_set() and self._condition():
            self.at = time.monotonic()
            self._done.set()

    async def wait(self, within: float = WITHIN_S) -> float:
        try:
            async with asyncio.timeout(within):
                await self._done.wait()
        finally:
            self._server.store.listeners.remove(self._check)
        return self.at


class Bench:
    """The stand-ins, the directories the agent is given, and its slices as stored."""

    def __init__(self, work: Path, node_file: Path) -> None:
        self.work = work
        self.node_file = node_file
        self.server = ApiServer((NODE,))
        self.server.bookmark_s = BOOKMARK_S
        self.watcher = PluginWatcher(work / "registry")
        self.kubelet = DraKubelet(self.watcher)
        self.reports_mark = 0  # node status patches before the latest agent's start

    async def __aenter__(self) -> Bench:
        await self.server.start()
        write_kubeconfig(self.work / "kubeconfig", self.server.url, token="bench")
        await self.watcher.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.kubelet.close()
        await self.watcher.stop()
        await self.server.stop()

    def agent(self, config: Obj | None = None, more: Sequence[str] = ()) -> AgentProcess:
        """The agent on this node, with `config` (the config file's document) and `more`
        flags of `node-agent run`."""
        extra = ["--api", "dra", "--node-name", NODE]
        extra += ["--kubeconfig", str(self.work / "kubeconfig")]
        extra += ["--kubelet-plugins-dir", str(self.work / "plugins")]
        extra += ["--kubelet-registry-dir", str(self.work / "registry")]
        extra += ["--cdi-root", str(self.work / "cdi")]
        return AgentProcess(self.work, self.node_file, config=config, extra=[*extra, *more])

    def devices(self, driver: str) -> dict[str, Obj]:
        return {
            d["name"]: d
            for s in self.server.store.slices.values()
            if s["spec"]["driver"] == driver and s["spec"]["nodeName"] == NODE
            for d in s["spec"]["devices"]
        }

    def claim(self, uid: str, results: list[tuple[str, str]]) -> Claim:
        """A claim allocated to (driver, device) pairs; the kubelet's reference to it."""
        entries = [
            {"request": f"r{i}", "driver": d, "pool": NODE, "device": dev}
            for i, (d, dev) in enumerate(results)
        ]
        self.server.store.put_claim("ns", f"c-{uid}", uid, entries)
        return ("ns", uid, f"c-{uid}")


def _out(bench: Bench, gpu: str) -> bool:
    return gpu not in bench.devices(GPU)


async def dra_figures(
    work: Path, claims: int, starts: int, faults: int, rest_s: float
) -> list[Figure]:
    node_file = work / "node.yaml"
    shutil.copy(bundled_node(DEMO_NODE), node_file)
    doc: Obj = yaml.safe_load(node_file.read_text())
    counts = {GPU: len(doc["gpus"]), NIC: len(doc["nics"])}
    (work / "dra").mkdir()
    async with Bench(work / "dra", node_file) as bench:
        agent, figures = await _starts(bench, counts, starts)
        try:
            figures += await _rest(bench, agent, work / "dp", node_file, rest_s)
            figures += await _prepare(bench, claims)
            figures.append(info("RSS after the claims (DRA)", agent.rss_kib() / 1024, "MB"))
            figures += await _faults(bench, doc, faults)
        finally:
            agent.stop()
    return figures


async def _starts(
    bench: Bench, counts: dict[str, int], runs: int
) -> tuple[AgentProcess, list[Figure]]:
    """Spawn -> both slices on the API server with every device, `runs` times; the last
    agent is left running. Before each start the node's slices are deleted, as the
    kubelet does when it starts."""
    ms: list[float] = []
    agent: AgentProcess | None = None
    for run in range(runs):
        bench.server.store.delete_node_slices(NODE)
        published = Moment(
            bench.server, lambda: {d: len(bench.devices(d)) for d in counts} == counts
        )
        serials = {d: r.serial for d, r in bench.watcher.drivers.items()}
        agent = bench.agent()
        bench.reports_mark = len(bench.server.store.statuses)
        agent.start()
        try:
            ms.append((await published.wait() - agent.started_at) * 1000)
            for driver in counts:
                await bench.watcher.registered(driver, WITHIN_S, after=serials.get(driver, 0))
        except BaseException:
            agent.stop()
            raise
        if run < runs - 1:
            code = agent.stop()
            if code != 0:
                raise RuntimeError(f"the DRA agent exited with {code}")
            for driver in counts:
                await bench.watcher.gone(driver, WITHIN_S)
    assert agent is not None
    note = (
        f"subprocess `node-agent run --api dra` on {DEMO_NODE} ({counts[GPU]} GPUs, "
        f"{counts[NIC]} NICs), spawn to both drivers' slices stored, {runs} starts"
    )
    return agent, [
        below(
            "DRA start -> both slices published median",
            statistics.median(ms),
            "ms",
            REGISTER_LIMIT_MS,
            note,
        ),
        info("DRA start -> both slices published max", max(ms), "ms"),
    ]


async def _rest(
    bench: Bench, agent: AgentProcess, dp_work: Path, node_file: Path, rest_s: float
) -> list[Figure]:
    """The DRA agent at rest for `rest_s`, with a device-plugin agent on the same node
    (registered with the kubelet stand-in) at rest beside it: RSS of each at the end, the
    DRA agent's CPU and its requests to the API server meanwhile."""
    dp = AgentProcess(dp_work, node_file)
    kubelet = Kubelet(dp.plugin_dir, seed=1)
    await kubelet.start()
    dp.start()
    try:
        await kubelet.wait_until(lambda k: _dp_registered(k, (DP_GPU, DP_NIC)), WITHIN_S)
        await _reported(bench)
        await asyncio.sleep(SETTLE_S)
        mark = len(bench.server.calls)
        before = agent.cpu_seconds(), dp.cpu_seconds(), time.monotonic()
        await asyncio.sleep(rest_s)  # the window at rest itself
        window = time.monotonic() - before[2]
        cpu = agent.cpu_seconds() - before[0]
        cpu_dp = dp.cpu_seconds() - before[1]
        calls = bench.server.calls[mark:]
        rss_dra, rss_dp = agent.rss_kib() / 1024, dp.rss_kib() / 1024
    finally:
        dp.stop()
        await kubelet.stop()
    requests = Counter(f"{c.verb} {c.resource}" for c in calls if not c.watch)
    watches = Counter(f"{c.resource}" for c in calls if c.watch)
    seen = ", ".join(f"{k} x{n}" for k, n in sorted(requests.items())) or "none"
    return [
        below(
            "RSS at rest (DRA)",
            rss_dra,
            "MB",
            RSS_LIMIT_MB,
            f"after start and {window:.0f} s at rest, {DEMO_NODE}, both drivers",
        ),
        info(
            "RSS at rest (device plugins)",
            rss_dp,
            "MB",
            f"`node-agent run --simulate` on {DEMO_NODE} registered with the kubelet "
            "stand-in, measured at the same moment",
        ),
        info(
            "idle CPU (DRA)",
            cpu / window * 100,
            "%",
            f"utime+stime over {window:.0f} s (clock tick 10 ms), watch bookmarks every "
            f"{BOOKMARK_S:g} s; device-plugin mode's target is < {IDLE_CPU_LIMIT:g} %",
        ),
        info("idle CPU (device plugins)", cpu_dp / window * 100, "%", "the same window"),
        Figure(
            "API requests at rest (DRA), not watches",
            float(sum(requests.values())),
            "",
            "0",
            not requests,
            f"over {window:.0f} s: {seen}; {bench.server.watching} watches open, "
            f"{sum(watches.values())} opened in the window",
        ),
    ]


async def _reported(bench: Bench) -> None:
    """Until the agent's reporter has done its start-up work: read the node's status
    (an empty patch) and, if it was not there, set the devices' condition."""
    store = bench.server.store

    def done() -> bool:
        read = len(store.statuses) > bench.reports_mark
        return read and store.condition(NODE, CONDITION_TYPE) is not None

    await Moment(bench.server, done).wait()


def _dp_registered(kubelet: Kubelet, resources: tuple[str, ...]) -> bool:
    views = [kubelet.resource(name) for name in resources]
    return all(v is not None and v.connected and v.devices for v in views)


def _pairs(bench: Bench) -> list[tuple[str, str]]:
    """(GPU, NIC on its PCIe switch) for every GPU, from the slices."""

    def switch(device: Obj) -> object:
        return device["attributes"].get("node-agents.io/pcieSwitch")

    nics = sorted(bench.devices(NIC).items())
    return [
        (name, next(n for n, nic in nics if switch(nic) == switch(gpu)))
        for name, gpu in sorted(bench.devices(GPU).items())
    ]


async def _prepare(bench: Bench, n: int) -> list[Figure]:
    """`n` claims of 2 GPUs + 2 NICs (paired), each prepared on both drivers one after the
    other as the kubelet does, then unprepared on both, so that the devices free up."""
    pairs = _pairs(bench)
    prepare: dict[str, list[float]] = {GPU: [], NIC: []}
    unprepare: list[float] = []
    per_claim: list[float] = []

    async def timed(
        call: Callable[[str, list[Claim]], Awaitable[Any]], driver: str, claim: Claim
    ) -> float:
        started = time.perf_counter()
        answer = await call(driver, [claim])
        took = (time.perf_counter() - started) * 1000
        if errors := {uid: c.error for uid, c in answer.claims.items() if c.error}:
            raise RuntimeError(f"claims failed: {errors}")
        return took

    with no_collection():  # this process stands for the kubelet
        for i in range(WARMUP + n):
            (g0, n0), (g1, n1) = pairs[(2 * i) % len(pairs)], pairs[(2 * i + 1) % len(pairs)]
            ref = bench.claim(f"u{i}", [(GPU, g0), (GPU, g1), (NIC, n0), (NIC, n1)])
            gpu = await timed(bench.kubelet.prepare, GPU, ref)
            nic = await timed(bench.kubelet.prepare, NIC, ref)
            undo = [await timed(bench.kubelet.unprepare, d, ref) for d in (GPU, NIC)]
            if i >= WARMUP:
                prepare[GPU].append(gpu)
                prepare[NIC].append(nic)
                per_claim.append(gpu + nic)
                unprepare += undo
    figures: list[Figure] = []
    note = (
        f"{n} claims of 2 GPUs + 2 NICs, prepared then unprepared; each call reads the "
        "claim from the stand-in (loopback HTTP), writes CDI specs and the checkpoint"
    )
    for label, ms in (
        (f"NodePrepareResources {GPU}", prepare[GPU]),
        (f"NodePrepareResources {NIC}", prepare[NIC]),
        ("prepare per claim (both drivers)", per_claim),
        ("NodeUnprepareResources per call", unprepare),
    ):
        figures.append(below(f"{label} p50", percentile(ms, 50), "ms", PREPARE_LIMIT_MS, note))
        figures.append(below(f"{label} p99", percentile(ms, 99), "ms", PREPARE_LIMIT_MS))
        note = ""
    return figures


async def _faults(bench: Bench, doc: Obj, rounds: int) -> list[Figure]:
    """XID 79 on a fresh GPU each round (no reset, no hold to wait out): from just before
    the node-file edit to the slice stored without it."""
    ms: list[float] = []
    rounds = min(rounds, len(doc["gpus"]))
    for i in range(rounds):
        gpu = doc["gpus"][i]
        name = f"gpu-{gpu['minor']}"
        if name not in bench.devices(GPU):
            raise RuntimeError(f"{name} is not in its slice before its fault")
        gone = Moment(bench.server, partial(_out, bench, name))
        gpu["xids"] = [79]
        started = time.monotonic()
        write_yaml(bench.node_file, doc)
        ms.append((await gone.wait() - started) * 1000)
    note = f"node-file edit (atomic rename) to the slice update stored, {rounds} GPUs in turn"
    return [
        below(
            "XID 79 -> out of the slice p50", percentile(ms, 50), "ms", OUT_OF_SLICE_LIMIT_MS, note
        ),
        below("XID 79 -> out of the slice max", max(ms), "ms", OUT_OF_SLICE_LIMIT_MS),
    ]
