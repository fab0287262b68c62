"""Pairing on a random workload through the stand-in, and GPU choice against brute force."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import random
import shutil
import signal
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from agents.backends import simulated_backends
from agents.config import Config, Pairing
from agents.core.topology import Distance, Topology
from agents.daemon import Agent
from agents.gpu.family import GpuFamily
from agents.plugin.api import DevicePlugins
from agents.roce.family import RoceFamily
from agents.sim.bundled import bundled_node
from agents.standin.kubelet import Container, Kubelet, Pod
from hack.benchlib.agent import GPU, NIC
from hack.benchlib.figures import Figure, at_least, info
from hack.benchlib.gpu_choice import choose_gpus
from hack.benchlib.judge import Judge, Knowledge, Tally, nics_for
from tests.standin.foreign import FlappingPlugin

MIX = {"paired": 0.6, "gpu-only": 0.2, "nic-only": 0.2}  # of admissions


@dataclass
class Run:
    """One workload's outcome: the tally, the mix, and the containers that missed."""

    tally: Tally = field(default_factory=Tally)
    counts: Counter[str] = field(default_factory=Counter)
    misses: list[str] = field(default_factory=list)  # pairable, not fully paired
    flips: int = 0  # health changes of the foreign plugin during the run

    @property
    def rate(self) -> float:
        t = self.tally
        return t.paired_any / t.pairable_any if t.pairable_any else 1.0

    def line(self, label: str) -> str:
        t = self.tally
        return (
            f"{label}: fully paired {t.paired_any}/{t.pairable_any} ({100 * self.rate:.1f}%) "
            f"where a fully paired choice existed among the free devices; "
            f"(diagnostic: {t.paired}/{t.pairable} where knowable without pod-resources); "
            f"foreign flips {self.flips}; mix {dict(sorted(self.counts.items()))}"
        )


class Workload:
    """Random pods of GPU+NIC, GPU-only and NIC-only containers, deleted as likely as the
    node is full (it hovers around half used). A pod that does not fit is refused before
    the device manager runs, as the scheduler does (see `Judge`)."""

    def __init__(self, kubelet: Kubelet, judge: Judge, node: str, seed: int) -> None:
        self.kubelet = kubelet
        self.judge = judge
        self.node = node
        self.rng = random.Random(seed)
        self.live: list[str] = []
        self.knowledge = Knowledge()
        self.run = Run()

    def _free(self, resource: str) -> set[str]:
        view = self.kubelet.resource(resource)
        healthy = view.healthy() if view is not None else set()
        return healthy - self.kubelet.allocated().get(resource, set())

    def _occupancy(self) -> float:
        used = sum(len(ids) for ids in self.kubelet.allocated().values())
        views = [self.kubelet.resource(r) for r in (GPU, NIC)]
        total = sum(len(view.devices) for view in views if view is not None)
        return used / total

    async def step(self, op: int) -> None:
        rng, run = self.rng, self.run
        if self.live and rng.random() < self._occupancy():
            pod = self.kubelet.pod(self.live.pop(rng.randrange(len(self.live))))
            assert pod is not None
            self.knowledge.released(pod.containers["main"].devices)
            await self.kubelet.release(pod.pod)
            run.counts["release"] += 1
            return
        kind = rng.choices(list(MIX), list(MIX.values()))[0]
        k = rng.randint(1, 4)
        limits = {
            "paired": {GPU: k, NIC: nics_for(self.node, k)},
            "gpu-only": {GPU: k},
            "nic-only": {NIC: rng.randint(1, 2)},
        }[kind]
        free = {r: self._free(r) for r in (GPU, NIC)}
        if any(len(free[r]) < n for r, n in limits.items()):
            run.counts[f"{kind}-refused"] += 1
            return
        name = f"pod-{op}"
        got = (await self.kubelet.admit(Pod(name, [Container("main", limits)]))).containers["main"]
        self.live.append(name)
        run.counts[kind] += 1
        if kind == "paired":
            known = self.knowledge.known(free, got.order)
            gpus, nics = got.devices[GPU], got.devices[NIC]
            if self.run.tally.add(self.judge, free, known, gpus, nics) or (
                self.judge.possible(free[GPU], free[NIC], len(gpus), len(nics))
                and not self.judge.fully_paired(gpus, nics)
            ):
                run.misses.append(f"{name} order={got.order} gpus={gpus} nics={nics}")
        self.knowledge.offered(got.order)


async def topology_of(node_file: Path, plugin_dir: Path) -> Topology:
    config = dataclasses.replace(Config.default(), pairing=Pairing(enabled=False))
    async with simulated_backends(node_file) as backends:
        agent = Agent(config, "<topology>", DevicePlugins(plugin_dir), backends)
        await agent.start()
        gpus, nics = agent.family(GpuFamily), agent.family(RoceFamily)
        assert gpus is not None and nics is not None
        return Topology(
            {g.uuid: g.location for g in gpus.gpus if g.location},
            {n.pci: n.location for n in nics.nics if n.location},
        )


@dataclass(frozen=True)
class Setup:
    node: str
    seed: int
    operations: int
    pod_resources: bool = True
    pairing: bool = True
    kill_at: int | None = None  # kill -9 the agent (a process then) after this operation
    flap_period: float = 0.05  # the foreign plugin's health flips; 0 for none


async def pairing_run(setup: Setup) -> Run:
    """The agent on a simulated node, the stand-in admitting and deleting pods, a foreign
    plugin flapping health; every GPU+NIC container judged against brute force."""
    with tempfile.TemporaryDirectory(prefix="na-pair-") as tmp:  # short: socket paths
        work = Path(tmp)
        node_file = work / "node.yaml"
        shutil.copy(bundled_node(setup.node), node_file)
        plugin_dir = work / "dp"
        plugin_dir.mkdir()
        socket = work / "pr.sock"
        kubelet = Kubelet(
            plugin_dir,
            seed=setup.seed,
            pod_resources_socket=socket if setup.pod_resources else None,
        )
        await kubelet.start()
        foreign = FlappingPlugin(plugin_dir, period=setup.flap_period or 3600.0)
        agent = AgentUnderTest(
            setup, node_file, plugin_dir, socket if setup.pod_resources else None
        )
        try:
            judge = Judge(await topology_of(node_file, work / "topo"))
            await agent.start(kubelet)
            await foreign.start()
            workload = Workload(kubelet, judge, setup.node, setup.seed)
            for op in range(setup.operations):
                if op == setup.kill_at:
                    await agent.kill_and_restart(kubelet)
                await workload.step(op)
            workload.run.flips = foreign.flips
            return workload.run
        finally:
            await foreign.stop()
            await agent.stop()
            await kubelet.stop()


class AgentUnderTest:
    """The agent in this process, or as `node-agent run --simulate` when it is to be
    killed (-9) and started again."""

    def __init__(self, setup: Setup, node_file: Path, plugin_dir: Path, socket: Path | None):
        self.setup, self.node_file, self.plugin_dir, self.socket = (
            setup,
            node_file,
            plugin_dir,
            socket,
        )
        self._stop = asyncio.Event()
        self._task: asyncio.Future[None] | None = None
        self._backends: contextlib.AsyncExitStack | None = None
        self._process: asyncio.subprocess.Process | None = None

    async def start(self, kubelet: Kubelet) -> None:
        if self.setup.kill_at is not None:
            await self._spawn()
        else:
            config = dataclasses.replace(Config.default(), pairing=Pairing(self.setup.pairing))
            self._backends = contextlib.AsyncExitStack()
            backends = await self._backends.enter_async_context(simulated_backends(self.node_file))
            agent = Agent(
                config,
                "<bench>",
                DevicePlugins(self.plugin_dir, self.socket),
                backends,
            )
            await agent.start()
            self._task = asyncio.ensure_future(agent.run(self._stop))
        await kubelet.wait_until(_ready, 30)

    async def _spawn(self) -> None:
        args = ["--simulate", str(self.node_file), "--device-plugin-dir", str(self.plugin_dir)]
        args += ["--pod-resources-socket", str(self.socket or self.plugin_dir / "none.sock")]
        with (self.plugin_dir.parent / "agent.log").open("a") as log:
            self._process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "agents.cli", "run", *args, stdout=log, stderr=log
            )

    async def kill_and_restart(self, kubelet: Kubelet) -> None:
        assert self._process is not None
        self._process.send_signal(signal.SIGKILL)
        await self._process.wait()
        # What the kubelet sees of a crashed plugin: its streams end.
        await kubelet.wait_until(lambda k: not any(_connected(k, r) for r in (GPU, NIC)), 30)
        await self._spawn()
        try:
            await kubelet.wait_until(_ready, 30)
        except TimeoutError as exc:
            tail = (self.plugin_dir.parent / "agent.log").read_text()[-2000:]
            raise TimeoutError(f"{exc}; the agent's log ends: {tail}") from exc

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        if self._backends is not None:
            await self._backends.aclose()
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()
            await self._process.wait()


def _connected(kubelet: Kubelet, resource: str) -> bool:
    view = kubelet.resource(resource)
    return view is not None and view.connected


def _ready(kubelet: Kubelet) -> bool:
    views = [kubelet.resource(r) for r in (GPU, NIC)]
    return all(v is not None and v.connected and v.healthy() for v in views)


async def pairing_figures(pods: int) -> list[Figure]:
    figures = []
    for node in ("h100-8gpu-8nic", "h100-8gpu-4nic"):
        for pod_resources in (True, False):
            run = await pairing_run(Setup(node, 11, pods, pod_resources=pod_resources))
            t = run.tally
            what = "with pod-resources" if pod_resources else "without pod-resources"
            detail = (
                f"{t.paired_any}/{t.pairable_any} GPU+NIC containers fully paired where a "
                f"fully paired choice existed among the free devices; {pods} operations, "
                f"resource order shuffled, a foreign plugin flapping every 50 ms"
            )
            value = 100 * run.rate
            figures.append(
                at_least(f"pairing rate {what} ({node})", value, "%", 100.0, detail)
                if pod_resources
                else info(f"pairing rate {what} ({node})", value, "%", detail)
            )
    return figures


def _score(
    chosen: tuple[str, ...],
    nvlinks: dict[frozenset[str], int],
    pcie: dict[frozenset[str], Distance],
) -> tuple[int, int]:
    pairs = [frozenset(p) for p in itertools.combinations(chosen, 2)]
    return (-sum(nvlinks.get(p, 0) for p in pairs), sum(int(pcie[p]) for p in pairs))


def choice_optimality(states: int, seed: int = 3) -> Figure:
    """choose_gpus on random 8-GPU states (links, distances, free set) vs every subset."""
    rng = random.Random(seed)
    ids = [f"GPU-{i}" for i in range(8)]
    optimal = 0
    for _ in range(states):
        pairs = [frozenset(p) for p in itertools.combinations(ids, 2)]
        nvlinks = {p: rng.choice((0, 0, 1, 2, 4, 12, 18)) for p in pairs if rng.random() < 0.6}
        pcie = {p: rng.choice(list(Distance)) for p in pairs}
        available = rng.sample(ids, rng.randint(1, 8))
        size = rng.randint(1, len(available))
        must = rng.sample(available, rng.randint(0, min(2, size)))
        got = tuple(choose_gpus(available, must, size, nvlinks=nvlinks, pcie=pcie))
        best = min(
            _score(c, nvlinks, pcie)
            for c in itertools.combinations(sorted(available), size)
            if set(must) <= set(c)
        )
        optimal += _score(got, nvlinks, pcie) == best
    return at_least(
        "preferred GPUs optimal vs brute force",
        100 * optimal / states,
        "%",
        100.0,
        f"{optimal}/{states} random 8-GPU states (NVLinks, PCIe distances, free set, must-include)",
    )
