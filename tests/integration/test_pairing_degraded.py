"""GPU<->NIC pairing with 1 of 8 NICs Degraded (its link at a quarter of its peers' speed
in the simulated node file): containers of 2 GPUs + 2 NICs still get Healthy NICs paired
with their GPUs wherever a Healthy pair is free, and get the Degraded NIC only when fewer
than 2 Healthy NICs are free. The workload of the pairing tests (the kubelet stand-in
with pod-resources, resources asked in a shuffled order, a foreign plugin flapping every
50 ms, GPU-only and NIC-only pods beside), judged by the same brute force over the node's
topology; and the same on the node with nothing Degraded.

The rate is over every 2+2 container admitted; those for which no Healthy pair was free
are counted and named, not left out."""

from __future__ import annotations

import asyncio
import random
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agents.backends import simulated_backends
from agents.config import Config
from agents.daemon import Agent
from agents.plugin.api import DevicePlugins
from agents.roce.family import RoceFamily
from agents.sim.bundled import bundled_node
from agents.standin.kubelet import Container, Kubelet, Pod
from hack.benchlib.agent import GPU, NIC
from hack.benchlib.judge import Judge
from hack.benchlib.pairing import topology_of
from tests.conditions import PROCESS_WAIT
from tests.families import running_family
from tests.standin.foreign import FlappingPlugin

OPERATIONS = 400
SEEDS = (101, 202)
FAST, SLOW = 400000, 100000
DEGRADED_NIC = 3  # its index in the node file
MIX = {"paired": 0.6, "gpu-only": 0.2, "nic-only": 0.2}  # of admissions, as the pairing tests


def node_doc(slow: int | None) -> dict[str, Any]:
    """The bundled 8-GPU, 8-NIC node, every NIC at FAST but NIC `slow` at SLOW."""
    doc: dict[str, Any] = yaml.safe_load(bundled_node("h100-8gpu-8nic").read_text())
    for i, nic in enumerate(doc["nics"]):
        nic["speedMbps"] = SLOW if i == slow else FAST
    return doc


@dataclass(frozen=True)
class Admitted:
    """One 2+2 container: what was free before it, in which order the kubelet asked, and
    what it got."""

    name: str
    order: tuple[str, ...]
    free: Mapping[str, frozenset[str]]
    gpus: frozenset[str]
    nics: frozenset[str]


@dataclass
class Outcome:
    containers: list[Admitted] = field(default_factory=list)
    degraded: frozenset[str] = frozenset()  # as the agent marked them before the workload
    flips: int = 0


class Workload:
    """Random pods as in the pairing tests, but every GPU+NIC container asks 2 + 2; a pod
    that does not fit is refused before admission, as the scheduler does."""

    def __init__(self, kubelet: Kubelet, seed: int) -> None:
        self.kubelet = kubelet
        self.rng = random.Random(seed)
        self.live: list[str] = []
        self.outcome = Outcome()

    def _free(self, resource: str) -> frozenset[str]:
        view = self.kubelet.resource(resource)
        healthy = view.healthy() if view is not None else set()
        return frozenset(healthy - self.kubelet.allocated().get(resource, set()))

    def _occupancy(self) -> float:
        used = sum(len(ids) for ids in self.kubelet.allocated().values())
        views = [self.kubelet.resource(r) for r in (GPU, NIC)]
        return used / sum(len(v.devices) for v in views if v is not None)

    async def step(self, op: int) -> None:
        rng = self.rng
        if self.live and rng.random() < self._occupancy():
            await self.kubelet.release(self.live.pop(rng.randrange(len(self.live))))
            return
        kind = rng.choices(list(MIX), list(MIX.values()))[0]
        limits = {
            "paired": {GPU: 2, NIC: 2},
            "gpu-only": {GPU: rng.randint(1, 4)},
            "nic-only": {NIC: rng.randint(1, 2)},
        }[kind]
        free = {r: self._free(r) for r in (GPU, NIC)}
        if any(len(free[r]) < n for r, n in limits.items()):
            return
        name = f"pod-{op}"
        got = (await self.kubelet.admit(Pod(name, [Container("main", limits)]))).containers["main"]
        self.live.append(name)
        if kind == "paired":
            devices = got.devices
            admitted = Admitted(
                name, tuple(got.order), free, frozenset(devices[GPU]), frozenset(devices[NIC])
            )
            self.outcome.containers.append(admitted)


def _ready(kubelet: Kubelet) -> bool:
    views = [kubelet.resource(r) for r in (GPU, NIC)]
    return all(v is not None and v.connected and len(v.healthy()) == 8 for v in views)


async def degraded_run(doc: Mapping[str, Any], seed: int) -> tuple[Judge, Outcome]:
    """The agent in this process on the node `doc`, the workload through the stand-in."""
    with tempfile.TemporaryDirectory(prefix="na-pdeg-") as tmp:  # short: socket paths
        work = Path(tmp)
        node_file = work / "node.yaml"
        node_file.write_text(yaml.safe_dump(dict(doc), sort_keys=False))
        plugin_dir = work / "dp"
        plugin_dir.mkdir()
        socket = work / "pr.sock"
        judge = Judge(await topology_of(node_file, work / "topo"))
        kubelet = Kubelet(plugin_dir, seed=seed, pod_resources_socket=socket)
        await kubelet.start()
        foreign = FlappingPlugin(plugin_dir, period=0.05)
        stop = asyncio.Event()
        try:
            async with simulated_backends(node_file) as backends:
                agent = Agent(
                    Config.default(),
                    "<test>",
                    DevicePlugins(plugin_dir, socket),
                    backends,
                )
                await agent.start()
                task = asyncio.ensure_future(agent.run(stop))
                try:
                    await kubelet.wait_until(_ready, PROCESS_WAIT)
                    inventory = running_family(agent, RoceFamily).resources()[0].inventory
                    workload = Workload(kubelet, seed)
                    workload.outcome.degraded = frozenset(
                        d.id for d in inventory.devices if d.degraded
                    )
                    await foreign.start()
                    for op in range(OPERATIONS):
                        await workload.step(op)
                    workload.outcome.flips = foreign.flips
                    return judge, workload.outcome
                finally:
                    stop.set()
                    await task
        finally:
            await foreign.stop()
            await kubelet.stop()


@dataclass
class Tally:
    """The 2+2 containers of some runs, judged with the Degraded NICs as not there."""

    every: int = 0
    healthy_paired: int = 0  # got Healthy NICs, fully paired with its GPUs
    possible: int = 0  # a Healthy fully paired choice was free
    paired_where_possible: int = 0
    misses: list[str] = field(default_factory=list)  # possible, not given
    needless: list[str] = field(default_factory=list)  # a Degraded NIC, 2 Healthy ones free
    impossible: list[str] = field(default_factory=list)  # no Healthy pair free: why

    def add(self, judge: Judge, c: Admitted, degraded: frozenset[str]) -> None:
        healthy_free = c.free[NIC] - degraded
        possible = judge.possible(set(c.free[GPU]), set(healthy_free), 2, 2)
        got = judge.fully_paired(c.gpus, c.nics) and not c.nics & degraded
        said = f"{c.name} order={','.join(c.order)} gpus={sorted(c.gpus)} nics={sorted(c.nics)}"
        self.every += 1
        self.healthy_paired += got
        self.possible += possible
        self.paired_where_possible += possible and got
        if possible and not got:
            self.misses.append(said)
        if c.nics & degraded and len(healthy_free) >= 2:
            self.needless.append(said)
        if not possible:
            why = "fewer than 2 Healthy NICs free" if len(healthy_free) < 2 else "no Healthy pair"
            self.impossible.append(f"{c.name}: {why} ({len(c.free[GPU])} GPUs free)")

    def line(self, label: str) -> str:
        rate = 100 * self.healthy_paired / self.every if self.every else 100.0
        return (
            f"{label}: {self.healthy_paired}/{self.every} 2+2 containers got Healthy NICs "
            f"fully paired ({rate:.1f}% of every one); a Healthy pair was free for "
            f"{self.possible} and given to {self.paired_where_possible}; no Healthy pair free "
            f"for {len(self.impossible)}; a Degraded NIC taken while 2 Healthy were free: "
            f"{len(self.needless)}"
        )


async def _tally(doc: Mapping[str, Any], expect_degraded: int) -> Tally:
    tally = Tally()
    for seed in SEEDS:
        judge, outcome = await degraded_run(doc, seed)
        assert len(outcome.degraded) == expect_degraded, f"Degraded: {sorted(outcome.degraded)}"
        assert outcome.flips >= 5, "the foreign plugin must flap during the run"
        for container in outcome.containers:
            tally.add(judge, container, outcome.degraded)
    return tally


async def test_with_one_nic_degraded_2_gpu_2_nic_containers_pair_with_healthy_nics() -> None:
    doc = node_doc(DEGRADED_NIC)
    tally = await _tally(doc, 1)
    print(f"\n  {tally.line(f'NIC {DEGRADED_NIC} of 8 Degraded')}")
    print("  no Healthy pair free: " + "; ".join(tally.impossible[:10]))
    assert tally.every >= 100, "the workload must exercise pairing"
    assert tally.needless == [], f"Degraded NIC chosen needlessly: {tally.needless[:5]}"
    assert tally.misses == [], (
        f"{len(tally.misses)} of {tally.possible} containers with a Healthy pair free did not "
        f"get one: {tally.misses[:5]}"
    )


async def test_with_nothing_degraded_the_figures_are_those_of_the_pairing_tests() -> None:
    """Speeds in the node file, all alike: nothing is Degraded, and every 2+2 container
    for which a fully paired choice was free gets one, as without the new fields."""
    tally = await _tally(node_doc(None), 0)
    print(f"\n  {tally.line('nothing Degraded')}")
    assert tally.every >= 100
    assert tally.misses == [], f"{len(tally.misses)} not fully paired: {tally.misses[:5]}"
