"""Partly occupied nodes: the GetPreferredAllocation calls a kubelet makes while pods
come and go, and the agent's pure choice for each."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents.core import gpu_choice, pairing
from agents.core.budget import Expired, never
from agents.core.pci import host_bridge
from agents.core.subsets import PairCosts
from agents.core.topology import PciLocation, Topology, distance
from hack.benchlib.agent import GPU, NIC
from hack.benchlib.gpu_choice import spread_replicas


@dataclass(frozen=True)
class Ask:
    """One GetPreferredAllocation as the kubelet sends it, and what the agent knows then."""

    resource: str
    available: list[str]  # healthy free devices and those already picked, in random order
    must: list[str]  # already picked
    size: int  # the container's whole request
    container_other: frozenset[str]  # the other resource's devices this container got
    other_free: frozenset[str]  # the other resource's free devices


class Model:
    """A node file's devices, partners and pair costs, computed as the agent does."""

    def __init__(self, doc: Mapping[str, Any], replicas: int = 0) -> None:
        self.doc = doc

        def location(d: Mapping[str, Any]) -> PciLocation:
            upstream = tuple(d["upstream"])
            return PciLocation(d["pci"], upstream, host_bridge(d["pci"], upstream), d["numa"])

        gpus = {g["uuid"]: location(g) for g in doc["gpus"]}
        nics = {n["pci"]: location(n) for n in doc["nics"]}
        numa = {pci: loc.numa for pci, loc in nics.items()}
        self.replicas = replicas
        self.gpu_of = {f"{g}::{r}": g for g in gpus for r in range(replicas)}
        gpu_ids = sorted(self.gpu_of) if replicas else sorted(gpus)
        self.devices = {GPU: gpu_ids, NIC: sorted(nics)}
        topology = Topology(gpus, nics)
        self.partners = {
            GPU: pairing.Partners({g: topology.nearest_nics(g) for g in gpus}),
            NIC: pairing.Partners({n: topology.nearest_gpus(n) for n in nics}),
        }
        links: dict[frozenset[str], int] = {}
        for g in doc["gpus"]:
            for peer in set(g["nvlinks"]):
                links[frozenset((g["uuid"], peer))] = g["nvlinks"].count(peer)
        self.costs = {
            GPU: gpu_choice.gpu_pair_costs(gpus, links, lambda a, b: distance(gpus[a], gpus[b])),
            NIC: PairCosts.of(sorted(nics), lambda a, b: int(numa[a] != numa[b])),
        }

    @property
    def paired(self) -> bool:
        return not self.replicas

    def choose(self, ask: Ask, expired: Expired = never) -> list[str]:
        """The pure choice the agent makes for `ask` (its core functions, no ledger)."""
        if ask.resource == GPU and self.replicas:
            gpu_of = self.gpu_of.__getitem__
            free = {gpu: 0 for gpu in self.gpu_of.values()}
            for replica in ask.available:
                free[gpu_of(replica)] += 1
            in_use = {gpu: self.replicas - n for gpu, n in free.items()}
            return spread_replicas(ask.available, ask.must, ask.size, gpu_of=gpu_of, in_use=in_use)
        if not self.paired:
            raise ValueError("without pairing, the NIC choice is no core function")
        costs = self.costs[ask.resource]
        view = self.view(ask)
        return pairing.prefer(ask.available, ask.must, ask.size, view, costs, expired=expired)

    def view(self, ask: Ask) -> pairing.PairView:
        """What the ledger knows at `ask` when it knows every pod's end."""
        return pairing.PairView(
            partners=self.partners[ask.resource],
            other_free=ask.other_free,
            container_other=ask.container_other,
            this_free=frozenset(ask.available) - frozenset(ask.must),
        )


@dataclass
class Workload:
    """Pods of GPU+NIC, GPU-only and NIC-only containers arriving and leaving at random,
    the node filled to a new random level before each one; the resources of a container
    are asked for in random order, as the kubelet ranges over a Go map."""

    devices: Mapping[str, Sequence[str]]
    rng: random.Random
    big: int = 8  # the most GPUs one container asks for
    pods: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    admitted: int = 0

    def free(self, resource: str) -> set[str]:
        held = {d for pod in self.pods.values() for d in pod.get(resource, ())}
        return set(self.devices[resource]) - held

    def _limits(self) -> dict[str, int]:
        gpus, nics = len(self.devices[GPU]), len(self.devices[NIC])
        k = self.rng.randint(1, min(self.big, gpus))
        kind = self.rng.random()
        if kind < 0.2:
            return {GPU: k}
        if kind < 0.35:
            return {NIC: self.rng.randint(1, min(4, nics))}
        ratio = nics / gpus if gpus <= 2 * nics else 1.0
        return {GPU: k, NIC: self.rng.randint(1, min(nics, max(1, math.ceil(k * ratio))))}

    def _make_room(self) -> None:
        """Release pods until the GPUs are used no more than a fresh random level."""
        level = self.rng.uniform(0.0, 0.9)
        total = len(self.devices[GPU])
        while self.pods and total - len(self.free(GPU)) > level * total:
            del self.pods[self.rng.choice(sorted(self.pods))]

    def admissions(self, choose: Callable[[Ask], list[str]]) -> Iterator[str]:
        """Admit containers forever; each answer of `choose` is allocated as the kubelet
        would. Yields each admitted pod's name after its last resource."""
        while True:
            self._make_room()
            limits = self._limits()
            while any(len(self.free(r)) < n for r, n in limits.items()):
                del self.pods[self.rng.choice(sorted(self.pods))]
            order = list(limits)
            self.rng.shuffle(order)
            name = f"pod-{self.admitted}"
            self.admitted += 1
            got: dict[str, list[str]] = {}
            self.pods[name] = got
            for resource in order:
                other = NIC if resource == GPU else GPU
                free = sorted(self.free(resource))
                picked = []
                if self.rng.random() < 0.25:
                    # Devices an init container held, reused first by the kubelet.
                    picked = self.rng.sample(free, self.rng.randint(1, min(2, limits[resource])))
                available = list(free)
                self.rng.shuffle(available)
                ask = Ask(
                    resource,
                    available,
                    picked,
                    limits[resource],
                    frozenset(got.get(other, ())),
                    frozenset(self.free(other)),
                )
                answer = choose(ask)
                _check(ask, answer)
                got[resource] = answer
            yield name


def _check(ask: Ask, answer: Sequence[str]) -> None:
    if len(answer) != ask.size or len(set(answer)) != ask.size:
        raise AssertionError(f"{ask.resource}: {len(answer)} devices, asked {ask.size}")
    if not set(ask.must) <= set(answer) <= set(ask.available):
        raise AssertionError(f"{ask.resource}: answer outside the request: {answer}")


def replicas_of(config: Mapping[str, Any] | None) -> int:
    if config is None:
        return 0
    resources = config["sharing"]["timeSlicing"]["resources"]
    return int(resources[0]["replicas"])


def biggest(model: Model) -> int:
    """Containers of up to 8 GPUs; up to half of a node of more than 16."""
    gpus = len(model.devices[GPU]) // max(model.replicas, 1)
    return 8 if gpus <= 16 else gpus // 2
