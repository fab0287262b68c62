"""Pairing on a random workload through the stand-in, and GPU choice against brute force."""

from __future__ import annotations

import asyncio
import itertools
import random
import shutil
import tempfile
from pathlib import Path

from agents.config import Config
from agents.core.gpu_choice import choose_gpus
from agents.core.topology import Distance, Topology
from agents.daemon import Agent, simulated_backends
from agents.sim.bundled import bundled_node
from agents.standin.kubelet import AdmissionError, Container, Kubelet, Pod
from hack.benchlib.agent import GPU, NIC
from hack.benchlib.figures import Figure, at_least


def pairable(
    free_gpus: set[str], free_nics: set[str], partners: dict[str, frozenset[str]], k: int, m: int
) -> bool:
    """Whether some k free GPUs have m free NICs among their nearest NICs."""
    if k > len(free_gpus) or m > len(free_nics):
        return False
    for combo in itertools.combinations(sorted(free_gpus), k):
        near = set().union(*(partners[g] for g in combo)) & free_nics
        if len(near) >= m:
            return True
    return False


class Workload:
    """Random pods of GPU+NIC, GPU-only and NIC-only containers; some leave again."""

    def __init__(self, kubelet: Kubelet, topology: Topology, seed: int) -> None:
        self.kubelet = kubelet
        self.partners = {g: topology.nearest_nics(g) for g in topology.gpus}
        self.rng = random.Random(seed)
        self.live: list[str] = []
        self.pairable = 0
        self.paired = 0

    def _free(self, resource: str) -> set[str]:
        view = self.kubelet.resource(resource)
        healthy = view.healthy() if view is not None else set()
        return healthy - self.kubelet.allocated().get(resource, set())

    def _limits(self) -> dict[str, int]:
        kind = self.rng.random()
        k = self.rng.randint(1, 4)
        if kind < 0.2:
            return {GPU: k}
        if kind < 0.3:
            return {NIC: self.rng.randint(1, 2)}
        return {GPU: k, NIC: self.rng.randint(1, k)}

    async def step(self, n: int) -> None:
        if self.live and (self.rng.random() < 0.4 or not self._free(GPU)):
            await self.kubelet.release(self.live.pop(self.rng.randrange(len(self.live))))
        limits = self._limits()
        k, m = limits.get(GPU, 0), limits.get(NIC, 0)
        both = k > 0 and m > 0
        could = both and pairable(self._free(GPU), self._free(NIC), self.partners, k, m)
        name = f"pod-{n}"
        try:
            got = await self.kubelet.admit(Pod(name, [Container("c", limits)]))
        except AdmissionError:
            return  # did not fit; the kubelet would say so too
        self.live.append(name)
        if could:
            gpus, nics = got.devices("c", GPU), got.devices("c", NIC)
            near = set().union(*(self.partners[g] for g in gpus))
            self.pairable += 1
            self.paired += all(nic in near for nic in nics)


async def pairing_rate(node: str, pods: int, seed: int) -> tuple[int, int]:
    with tempfile.TemporaryDirectory(prefix="node-agent-bench-") as tmp:
        work = Path(tmp)
        node_file = work / "node.yaml"
        shutil.copy(bundled_node(node), node_file)
        kubelet = Kubelet(work / "device-plugins", seed=seed)
        await kubelet.start()
        stop = asyncio.Event()
        async with simulated_backends(node_file) as backends:
            agent = Agent(Config.default(), "<defaults>", kubelet.plugin_dir, backends)
            agent.start()
            task = asyncio.ensure_future(agent.run(stop))
            try:
                await kubelet.wait_until(
                    lambda k: all(k.resource(r) is not None for r in (GPU, NIC)), 10
                )
                assert agent.gpu is not None and agent.roce is not None
                topology = Topology(
                    {g.uuid: g.location for g in agent.gpu.gpus if g.location},
                    {n.pci: n.location for n in agent.roce.nics if n.location},
                )
                workload = Workload(kubelet, topology, seed)
                for n in range(pods):
                    await workload.step(n)
            finally:
                stop.set()
                await task
        await kubelet.stop()
        return workload.paired, workload.pairable


async def pairing_figures(pods: int) -> list[Figure]:
    figures = []
    for node in ("h100-8gpu-8nic", "h100-8gpu-4nic"):
        paired, could = await pairing_rate(node, pods, seed=11)
        figures.append(
            at_least(
                f"pairing rate ({node})",
                100 * paired / max(could, 1),
                "%",
                100.0,
                f"{paired}/{could} GPU+NIC containers paired where a pair was free; "
                f"{pods} random pods, resource order shuffled",
            )
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
