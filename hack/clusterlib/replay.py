"""The device plugins' side of the contrast: on the node the scheduler picked by counts,
the devices the agent's own pairing ledger prefers, asked as a kubelet asks (each resource
of the container in an order of its own, pod-resources listing who holds what)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from agents.core import gpu_choice
from agents.core.kubelet_checkpoint import Checkpoint
from agents.core.ledger import GPU, NIC, Ledger
from agents.core.subsets import PairCosts
from agents.core.topology import Topology, distance
from hack.clusterlib.layouts import Layout
from hack.clusterlib.workload import GPU_RESOURCE, NIC_RESOURCE, Shape

RESOURCE = {GPU: GPU_RESOURCE, NIC: NIC_RESOURCE}


class NodeReplay:
    """One node's device plugins: the ledger and GPU/NIC choice that the device-plugin
    runtime calls (agents.core.ledger, agents.core.pairing, agents.core.gpu_choice), fed
    the facts a kubelet with pod-resources gives it."""

    def __init__(self, layout: Layout, seed: int) -> None:
        self.rng = random.Random(seed)
        gpus = {p.plugin_id: p.location for p in layout.of("gpu")}
        nics = {p.plugin_id: p.location for p in layout.of("nic")}
        topology = Topology(gpus, nics)
        self.ids = {GPU: sorted(gpus), NIC: sorted(nics)}
        self.ledger = Ledger()
        self.ledger.set_partners(GPU, GPU_RESOURCE, {g: topology.nearest_nics(g) for g in gpus})
        self.ledger.set_partners(NIC, NIC_RESOURCE, {n: topology.nearest_gpus(n) for n in nics})
        peers = {
            frozenset((str(g["uuid"]), str(p))): 1
            for g in layout.document["gpus"]
            for p in g.get("nvlinks") or []
        }
        self.costs = {
            GPU: gpu_choice.gpu_pair_costs(gpus, peers, lambda a, b: distance(gpus[a], gpus[b])),
            NIC: PairCosts.of(sorted(nics), lambda a, b: int(nics[a].numa != nics[b].numa)),
        }
        self.held: dict[str, dict[str, list[str]]] = {}  # pod -> kind -> device IDs
        self.ledger.checkpoint(self._checkpoint(), 0)

    def admit(self, pod: str, shape: Shape) -> dict[str, list[str]]:
        """The devices of each kind this pod's container gets; the scheduler placed it, so
        they are free (counts are all it checks)."""
        kinds = [GPU, NIC] if shape.paired else [GPU]
        self.rng.shuffle(kinds)
        got: dict[str, list[str]] = {}
        self.held[pod] = got
        for kind in kinds:
            if self.ledger.wants_listing(kind):
                self.ledger.pod_resources(self._listing(exclude=pod))
            chosen = self.ledger.prefer(kind, self.free(kind), [], shape.size, self.costs[kind])
            if len(chosen) != shape.size:
                raise RuntimeError(f"{pod}: {shape.size} of {kind} asked, {chosen} chosen")
            self.ledger.allocated(kind, chosen)
            got[kind] = chosen
        # The kubelet's end-of-admission checkpoint write.
        self.ledger.checkpoint(self._checkpoint(), 1)
        return got

    def release(self, pod: str) -> None:
        self.held.pop(pod, None)

    def free(self, kind: str) -> list[str]:
        taken = {d for got in self.held.values() for d in got.get(kind, [])}
        return [d for d in self.ids[kind] if d not in taken]

    def _listing(self, exclude: str) -> dict[tuple[str, str], dict[str, Sequence[str]]]:
        return {
            (pod, "main"): {RESOURCE[k]: ids for k, ids in got.items()}
            for pod, got in self.held.items()
            if pod != exclude
        }

    def _checkpoint(self) -> Checkpoint:
        holdings: dict[str, dict[tuple[str, str], frozenset[str]]] = {}
        for pod, got in self.held.items():
            for kind, ids in got.items():
                holdings.setdefault(RESOURCE[kind], {})[(pod, "main")] = frozenset(ids)
        registered = {RESOURCE[k]: frozenset(ids) for k, ids in self.ids.items()}
        return Checkpoint(holdings, registered)
