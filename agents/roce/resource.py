"""The RoCE resource: NIC functions, and the device nodes and NCCL environment a container
gets for some of them."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Mapping, Sequence

from agents.core import budget
from agents.core.device import DeviceNode
from agents.core.health import Grade
from agents.core.healthy_first import graded, healthy_first
from agents.core.ledger import PairingSide
from agents.core.subsets import PairCosts
from agents.kernel.catalogue import Inventory, listed
from agents.kernel.edits import ContainerEdits, KeptEdits
from agents.roce.discovery import Nic

RDMA_CM = "/dev/infiniband/rdma_cm"
HCA_ENV = "NCCL_IB_HCA"
NETDEVS_ENV = "RDMA_NETDEVS"
ANSWERS_KEPT = 1024  # container edits kept per resource: past it, all are forgotten


class RoceResource:
    def __init__(
        self,
        name: str,
        nics: Sequence[Nic],
        *,
        dev_root: str = "",
        pairing: PairingSide | None = None,
        clock: Callable[[], float] = time.monotonic,
        degraded_unhealthy: bool = False,
    ) -> None:
        self._name = name
        self._degraded_unhealthy = degraded_unhealthy  # health.degraded.report: unhealthy
        self._clock = clock
        self._dev_root = dev_root
        self.nics: dict[str, Nic] = {}
        self._inventory = Inventory()
        self._answers = KeptEdits(self._edits, ANSWERS_KEPT)
        self.pairing = pairing  # the GPUs paired with these NICs, if any
        self._pair_costs: PairCosts | None = None
        self.set_nics(nics, {n.pci: True for n in nics})

    @property
    def name(self) -> str:
        return self._name

    summary = "NICs"

    def definition(self) -> Hashable:
        """The devices: a change registers the resource again."""
        return listed(self._inventory)

    @property
    def inventory(self) -> Inventory:
        return self._inventory

    def set_nics(self, nics: Sequence[Nic], health: Mapping[str, bool | Grade]) -> bool:
        """Advertise exactly these NICs with this health (by PCI address: a grade, or a
        bool for Healthy or Unhealthy; a NIC left out is Unhealthy); True if the list
        changed."""
        now = {n.pci: n for n in nics}
        if now != self.nics:
            self._answers.clear()  # a NIC's interface or uverbs node may have changed
        self.nics = now
        unhealthy = self._degraded_unhealthy
        changed = self._inventory.replace(
            graded(n.pci, _grade(health.get(n.pci, False)), n.numa, degraded_unhealthy=unhealthy)
            for n in nics
        )
        if changed and self.pairing is not None:
            self.pairing.graded(self._inventory.degraded())
        return changed

    def set_health(self, health: Mapping[str, Grade]) -> bool:
        """The same NICs at these grades (by PCI address); True if the list changed."""
        return self.set_nics(list(self.nics.values()), health)

    def physical_id(self, device_id: str) -> str:
        return device_id  # a NIC function is served whole

    def allocate(self, device_ids: Sequence[str]) -> ContainerEdits:
        """What the container the kubelet gives these NICs gets."""
        if self.pairing is not None:
            self.pairing.allocated(device_ids)
        return self.edits(device_ids)

    def edits(self, device_ids: Sequence[str]) -> ContainerEdits:
        """What a container gets for these NICs together, and each NIC's device nodes;
        kept per set of NICs in the order given until the NICs change."""
        return self._answers.get(device_ids)

    def _edits(self, device_ids: Sequence[str]) -> ContainerEdits:
        nics = [self.nics[i] for i in device_ids]
        rdma_cm = self._node(RDMA_CM)
        own = {n.pci: self._node(f"/dev/infiniband/{n.uverbs}") for n in nics}
        return ContainerEdits(
            env={
                # "=" asks NCCL for exact names: mlx5_1 must not also match mlx5_10.
                HCA_ENV: "=" + ",".join(f"{n.rdma}:{n.port}" for n in nics),
                NETDEVS_ENV: ",".join(n.netdev for n in nics),
            },
            nodes=(*own.values(), rdma_cm),
            device_nodes={(self._name, pci): (node, rdma_cm) for pci, node in own.items()},
        )

    def _node(self, path: str) -> DeviceNode:
        return DeviceNode(path, self._dev_root + path, "rw")

    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """The best `size` NICs; Degraded ones only where Healthy ones are too few."""
        degraded = self._inventory.degraded(available)
        if self.pairing is not None:
            expired = budget.deadline(self._clock, budget.PREFERRED_ALLOCATION_S)
            costs = self._costs()
            paired = self.pairing.prefer(
                available, must_include, size, costs, expired=expired, degraded=degraded
            )
            if paired is not None:
                return paired
        available, must_include = healthy_first(available, must_include, size, degraded)
        # Without a GPU partner: stay on the NUMA node of what is already chosen.
        numas = {self.nics[i].numa for i in must_include}
        rest = sorted(
            (i for i in available if i not in must_include),
            key=lambda i: (self.nics[i].numa not in numas, self.nics[i].numa or 0, i),
        )
        return [*must_include, *rest[: size - len(must_include)]]

    def _costs(self) -> PairCosts:
        """Pairs across NUMA nodes, fewest first: the tie-break once pairing has had its say.
        Built again only when the set of NICs changes."""
        if self._pair_costs is None or set(self._pair_costs.index) != set(self.nics):
            numa = {pci: nic.numa for pci, nic in self.nics.items()}
            self._pair_costs = PairCosts.of(list(numa), lambda a, b: int(numa[a] != numa[b]))
        return self._pair_costs


def _grade(health: bool | Grade) -> Grade:
    if isinstance(health, Grade):
        return health
    return Grade.HEALTHY if health else Grade.UNHEALTHY
