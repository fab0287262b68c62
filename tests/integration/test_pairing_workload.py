"""GPU<->NIC pairing under a random workload: the agent in-process, the kubelet stand-in
admitting and releasing pods, and every GPU+NIC container checked against brute force."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from agents.config import Config, Pairing
from agents.core.topology import Topology
from agents.daemon import Agent, simulated_backends
from agents.gpu.plan import GPU_RESOURCE
from agents.sim.bundled import bundled_node
from agents.standin.kubelet import AllocatedContainer, Container, Kubelet, Pod
from hack.benchlib.pairing import Judge, Knowledge, Tally, nics_for

NIC = "rdma/roce"
OPERATIONS = 400
SEED = 20240611
WAIT_S = 10.0
MIX = {"paired": 0.6, "gpu-only": 0.2, "nic-only": 0.2}  # of admissions


@dataclass
class Workload:
    """What one run did, and how its GPU+NIC containers came out."""

    counts: Counter[str] = field(default_factory=Counter)
    tally: Tally = field(default_factory=Tally)
    misses: list[str] = field(default_factory=list)  # knowable but not fully paired

    @property
    def rate(self) -> float:
        t = self.tally
        return t.paired_any / t.pairable_any if t.pairable_any else 1.0

    def line(self, label: str) -> str:
        mix = ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        t = self.tally
        return (
            f"{label}: fully paired {t.paired_any}/{t.pairable_any} "
            f"({100 * self.rate:.1f}%), knowably possible {t.pairable}, "
            f"misses among those {len(self.misses)}; mix: {mix}"
        )


async def run_workload(node: str, work: Path, *, pairing: bool, seed: int = SEED) -> Workload:
    node_file = work / f"{node}.yaml"
    shutil.copy(bundled_node(node), node_file)
    # A short directory: unix socket paths are limited to 107 bytes.
    plugin_dir = Path(tempfile.mkdtemp(prefix="na-pair-"))
    config = dataclasses.replace(Config.default(), pairing=Pairing(enabled=pairing))
    kubelet = Kubelet(plugin_dir, seed=seed)
    await kubelet.start()
    stop = asyncio.Event()
    result = Workload()
    async with simulated_backends(node_file) as backends:
        agent = Agent(config, "<test>", plugin_dir, backends)
        agent.start()
        task = asyncio.ensure_future(agent.run(stop))
        try:
            await kubelet.wait_until(_both_registered, WAIT_S)
            assert agent.gpu is not None and agent.roce is not None
            judge = Judge(
                Topology(
                    {g.uuid: g.location for g in agent.gpu.gpus if g.location},
                    {n.pci: n.location for n in agent.roce.nics if n.location},
                )
            )
            await _drive(kubelet, judge, node, random.Random(seed), result)
        finally:
            stop.set()
            await task
    await kubelet.stop()
    shutil.rmtree(plugin_dir, ignore_errors=True)
    return result


def _both_registered(kubelet: Kubelet) -> bool:
    views = [kubelet.resource(GPU_RESOURCE), kubelet.resource(NIC)]
    return all(v is not None and v.connected and v.healthy() for v in views)


async def _drive(
    kubelet: Kubelet, judge: Judge, node: str, rng: random.Random, result: Workload
) -> None:
    live: list[str] = []
    knowledge = Knowledge()
    kinds, weights = zip(*MIX.items(), strict=True)
    for op in range(OPERATIONS):
        # Releases as likely as the node is full: it hovers around half used.
        if live and rng.random() < _occupancy(kubelet):
            gone = kubelet.pod(live.pop(rng.randrange(len(live))))
            assert gone is not None
            knowledge.released(gone.containers["main"].devices)
            await kubelet.release(gone.pod)
            result.counts["release"] += 1
            continue
        kind = rng.choices(kinds, weights)[0]
        k = rng.randint(1, 4)
        limits = {
            "paired": {GPU_RESOURCE: k, NIC: nics_for(node, k)},
            "gpu-only": {GPU_RESOURCE: k},
            "nic-only": {NIC: rng.randint(1, 2)},
        }[kind]
        free = {r: _free(kubelet, r) for r in (GPU_RESOURCE, NIC)}
        if any(len(free[r]) < n for r, n in limits.items()):
            # The kubelet's resource-fit check refuses it before the device manager runs.
            result.counts[f"{kind}-refused-no-devices"] += 1
            continue
        name = f"pod-{op}"
        allocation = await kubelet.admit(Pod(name, [Container("main", limits)]))
        live.append(name)
        result.counts[kind] += 1
        got = allocation.containers["main"]
        if kind == "paired":
            _judge(judge, free, knowledge.known(free, got.order), got, result=result, name=name)
        knowledge.offered(got.order)


def _judge(
    judge: Judge,
    free: dict[str, set[str]],
    known: dict[str, set[str]],
    got: AllocatedContainer,
    *,
    result: Workload,
    name: str,
) -> None:
    gpus, nics = got.devices[GPU_RESOURCE], got.devices[NIC]
    if result.tally.add(judge, free, known, gpus, nics):
        result.misses.append(f"{name} order={got.order} gpus={gpus} nics={nics}")


def _occupancy(kubelet: Kubelet) -> float:
    used = sum(len(ids) for ids in kubelet.allocated().values())
    total = sum(len(view.devices) for view in kubelet.resources().values())
    return used / total


def _free(kubelet: Kubelet, resource: str) -> set[str]:
    view = kubelet.resource(resource)
    assert view is not None
    return view.healthy() - kubelet.allocated().get(resource, set())


@pytest.mark.parametrize("node", ["h100-8gpu-8nic", "h100-8gpu-4nic"])
async def test_every_gpu_nic_container_is_fully_paired_when_possible(
    node: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    on = await run_workload(node, tmp_path, pairing=True)
    off = await run_workload(node, tmp_path, pairing=False)
    print(f"\n{node}\n  {on.line('pairing on ')}\n  {off.line('pairing off')}")
    print(f"  ({time.monotonic() - started:.1f} s for both runs)")
    assert on.tally.pairable_any >= 50, "the workload must exercise pairing"
    assert on.misses == [], f"{len(on.misses)} containers not fully paired: {on.misses[:5]}"
    assert off.rate <= on.rate
