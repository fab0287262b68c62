"""Pairing on a random workload through the stand-in, and GPU choice against brute force."""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agents.config import Config
from agents.core.gpu_choice import choose_gpus
from agents.core.topology import Distance, Topology
from agents.daemon import Agent, simulated_backends
from agents.sim.bundled import bundled_node
from agents.standin.kubelet import Container, Kubelet, Pod
from hack.benchlib.agent import GPU, NIC
from hack.benchlib.figures import Figure, at_least, info


class Judge:
    """Brute force over the topology: what "fully paired" means, and whether a fully paired
    choice existed that the agent could have known of. The one definition that the bench
    and the integration test share.

    A GPU's partners are the NICs at its smallest PCIe distance. A container with GPUs G and
    NICs N is fully paired when
      (a) every NIC in N is a partner of some GPU in G, and
      (b) the number of GPUs in G with a partner in N is min(|G|, reach(|N|)), where
          reach(m) is the most GPUs that any m NICs of this node are partners of: every GPU
          has a partner in N unless the NIC count alone makes that impossible.

    For a container that got k GPUs and m NICs, a fully paired choice existed when some k
    GPUs and m NICs that the agent knew to be free are fully paired (`possible` with the
    sets of `Knowledge.known`). The kubelet asks the container's resources one after the
    other, so the agent makes the first choice knowing of the other resource only what it
    learned before: a device freed by a pod that held nothing of the other kind stays
    unknown until its own resource is asked for again. Nor does it know the second size
    yet, so workloads ask for NICs in the node's ratio (`nics_for`), which is what a fully
    paired first choice has to assume; and they refuse a pod that does not fit before
    admission, as the scheduler does, since a pod failed half way leaves no checkpoint
    rename and the agent could not tell its containers apart.
    """

    def __init__(self, topology: Topology) -> None:
        self.partners = topology.pairs()
        nics = sorted(topology.nics)
        served = {n: {g for g, p in self.partners.items() if n in p} for n in nics}
        self.reach = {
            m: max(
                (
                    len(set().union(*(served[n] for n in s)))
                    for s in itertools.combinations(nics, m)
                ),
                default=0,
            )
            for m in range(len(nics) + 1)
        }

    def fully_paired(self, gpus: Iterable[str], nics: Iterable[str]) -> bool:
        g, n = set(gpus), set(nics)
        reachable = set().union(*(self.partners[x] for x in g)) if g else set()
        if not n <= reachable:
            return False
        covered = sum(1 for x in g if self.partners[x] & n)
        return covered >= min(len(g), self.reach[len(n)])

    def possible(self, free_gpus: set[str], free_nics: set[str], k: int, m: int) -> bool:
        for gpus in itertools.combinations(sorted(free_gpus), k):
            near = set().union(*(self.partners[x] for x in gpus)) & free_nics
            if len(near) < m:
                continue
            if any(self.fully_paired(gpus, n) for n in itertools.combinations(sorted(near), m)):
                return True
        return False


def nics_for(node: str, k: int) -> int:
    """NICs asked with k GPUs: one each on 8-NIC nodes, one per two GPUs on 4-NIC nodes."""
    return k if node == "h100-8gpu-8nic" else math.ceil(k / 2)


class Knowledge:
    """Which free devices the agent can know of when it makes a container's first choice."""

    def __init__(self) -> None:
        # Freed by a pod that held no device of the other kind, not offered since: nothing
        # the kubelet sent tells the agent that they are free.
        self.unseen: dict[str, set[str]] = {GPU: set(), NIC: set()}

    def released(self, held: Mapping[str, Iterable[str]]) -> None:
        """A pod holding these devices (by resource) is gone."""
        if len(held) == 1:
            for resource, ids in held.items():
                self.unseen[resource].update(ids)

    def known(self, free: Mapping[str, set[str]], order: Sequence[str]) -> dict[str, set[str]]:
        """Of the devices `free` before a container asked for `order`, those known when
        the first was chosen: all of the first resource (the kubelet lists them)."""
        return {r: ids - self.unseen[r] if r != order[0] else set(ids) for r, ids in free.items()}

    def offered(self, order: Iterable[str]) -> None:
        """The kubelet asked for these resources, offering every free device of them."""
        for resource in order:
            self.unseen[resource].clear()


@dataclass
class Tally:
    """GPU+NIC containers judged: those for which a fully paired choice existed at all,
    those for which the agent could know of one, and how many of each got one."""

    pairable_any: int = 0
    paired_any: int = 0
    pairable: int = 0
    paired: int = 0

    def add(
        self,
        judge: Judge,
        free: Mapping[str, set[str]],
        known: Mapping[str, set[str]],
        gpus: Sequence[str],
        nics: Sequence[str],
    ) -> bool:
        """Count one container (`free` and `known` by resource, as before it was
        admitted); True when it missed a pair that the agent could know of."""
        k, m = len(gpus), len(nics)
        if not judge.possible(free[GPU], free[NIC], k, m):
            return False  # nor could the agent know of one: the known sets are smaller
        fully = judge.fully_paired(gpus, nics)
        self.pairable_any += 1
        self.paired_any += fully
        if not judge.possible(known[GPU], known[NIC], k, m):
            return False
        self.pairable += 1
        self.paired += fully
        return not fully


class Workload:
    """Random pods of GPU+NIC, GPU-only and NIC-only containers; some leave again.

    A pod that does not fit is refused before the device manager runs, as the scheduler
    does (see `Judge`).
    """

    def __init__(self, kubelet: Kubelet, topology: Topology, node: str, seed: int) -> None:
        self.kubelet = kubelet
        self.judge = Judge(topology)
        self.node = node
        self.rng = random.Random(seed)
        self.live: list[str] = []
        self.knowledge = Knowledge()
        self.tally = Tally()

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
        return {GPU: k, NIC: nics_for(self.node, k)}

    async def _release(self) -> None:
        pod = self.kubelet.pod(self.live.pop(self.rng.randrange(len(self.live))))
        assert pod is not None
        self.knowledge.released(pod.containers["c"].devices)
        await self.kubelet.release(pod.pod)

    async def step(self, n: int) -> None:
        if self.live and (self.rng.random() < 0.4 or not self._free(GPU)):
            await self._release()
        limits = self._limits()
        free = {r: self._free(r) for r in (GPU, NIC)}
        if any(len(free[r]) < size for r, size in limits.items()):
            return  # does not fit: refused before any device is picked
        name = f"pod-{n}"
        got = (await self.kubelet.admit(Pod(name, [Container("c", limits)]))).containers["c"]
        self.live.append(name)
        if len(got.order) == 2:
            known = self.knowledge.known(free, got.order)
            self.tally.add(self.judge, free, known, got.devices[GPU], got.devices[NIC])
        self.knowledge.offered(got.order)


async def pairing_rate(node: str, pods: int, seed: int) -> Tally:
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
                workload = Workload(kubelet, topology, node, seed)
                for n in range(pods):
                    await workload.step(n)
            finally:
                stop.set()
                await task
        await kubelet.stop()
        return workload.tally


async def pairing_figures(pods: int) -> list[Figure]:
    figures = []
    for node in ("h100-8gpu-8nic", "h100-8gpu-4nic"):
        run = await pairing_rate(node, pods, seed=11)
        figures.append(
            at_least(
                f"pairing rate ({node})",
                100 * run.paired / max(run.pairable, 1),
                "%",
                100.0,
                f"{run.paired}/{run.pairable} GPU+NIC containers fully paired where the agent "
                f"could know of a fully paired choice; "
                f"{pods} random pods, resource order shuffled",
            )
        )
        figures.append(
            info(
                f"pairing rate, all ({node})",
                100 * run.paired_any / max(run.pairable_any, 1),
                "%",
                f"{run.paired_any}/{run.pairable_any} where a fully paired choice existed, "
                "including those only a pod's unreported end made possible",
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
