"""What "fully paired" means and whether a fully paired choice existed: brute force over
a node's topology, shared by the bench, the workload test and the lab script."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from agents.core.topology import Topology
from hack.benchlib.agent import GPU, NIC


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
