"""One GPU resource: its devices, what a container gets for some of them, and the
preferred choice."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice

from agents.config import Flags
from agents.core import budget, gpu_choice
from agents.core.device import Device
from agents.core.health import Grade
from agents.core.healthy_first import graded, healthy_first
from agents.core.ledger import PairingSide
from agents.core.subsets import PairCosts
from agents.core.topology import Distance
from agents.errors import AllocationError, Code
from agents.gpu.allocation import GpuNodes, gpu_edits
from agents.gpu.plan import ResourcePlan, Unit
from agents.kernel.catalogue import Inventory, listed
from agents.kernel.edits import ContainerEdits, KeptEdits

ANSWERS_KEPT = 1024  # Allocate answers kept per resource: past it, all are forgotten


@dataclass(frozen=True)
class AllocateOptions:
    flags: Flags  # device IDs, driver features, device roots, replica policy
    fail_requests_greater_than_one: bool
    minors: Mapping[str, int]  # physical GPU UUID -> /dev/nvidia<minor>
    mig_caps: Mapping[str, tuple[str, ...]]  # MIG UUID -> its /dev/nvidia-caps devices
    dev_root: str  # "" on a real node; the simulator's root on a simulated one
    imex_channels: tuple[int, ...] = ()  # the IMEX channels every container gets
    mps_root: str | None = None  # flags.mpsRoot, where MPS is served


def whole_gpus(plan: ResourcePlan) -> bool:
    """Whether each device of the plan is one physical GPU (not a replica or MIG instance)."""
    return not plan.replicated and all(u.visible_id == u.gpu_uuid for u in plan.units)


class GpuResource:
    """Serves one GPU resource name (whole GPUs, MIG instances or replicas)."""

    def __init__(
        self,
        plan: ResourcePlan,
        options: AllocateOptions,
        *,
        nvlinks: Mapping[frozenset[str], int],
        pcie: Callable[[str, str], Distance],
        pairing: PairingSide | None = None,
        clock: Callable[[], float] = time.monotonic,
        degraded_unhealthy: bool = False,
    ) -> None:
        self._name = plan.name
        self._degraded_unhealthy = degraded_unhealthy  # health.degraded.report: unhealthy
        self._clock = clock
        self.plan = plan
        self._units = {u.id: u for u in plan.units}
        self._options = options
        self._nvlinks = nvlinks  # keyed by physical GPU UUIDs
        self._pcie = pcie  # on physical GPU UUIDs
        self._inventory = Inventory(Device(u.id, True, u.numa) for u in plan.units)
        self.pairing = pairing  # the NICs paired with these GPUs, if any
        self._pair_costs: PairCosts | None = None
        self._replicas: _Replicas | None = None
        self._nodes = GpuNodes(
            options.minors,
            options.mig_caps,
            options.dev_root,
            options.imex_channels,
            options.mps_root if plan.mps else None,
        )
        # What a container gets, by device IDs in the order given (see `edits`).
        self._answers = KeptEdits(self._edits, ANSWERS_KEPT)

    @property
    def whole_gpus(self) -> bool:
        """Whether each device is one physical GPU (not a replica or a MIG instance)."""
        return whole_gpus(self.plan)

    @property
    def name(self) -> str:
        return self._name

    @property
    def summary(self) -> str:
        return "whole GPUs" if self.whole_gpus else "shared or MIG GPUs"

    def definition(self) -> Hashable:
        """Devices and what Allocate hands out: a change registers the resource again."""
        options = self._options
        fail_over_one = options.fail_requests_greater_than_one
        return listed(self._inventory), options.flags, fail_over_one, self.plan.mps

    @property
    def inventory(self) -> Inventory:
        return self._inventory

    def unit(self, device_id: str) -> Unit:
        return self._units[device_id]

    def set_health(self, grades: Mapping[str, Grade]) -> bool:
        """Apply each physical GPU's grade to its units (a MIG instance or a replica is
        as its GPU); units of GPUs missing from the map are no longer advertised. True if
        anything changed."""
        unhealthy = self._degraded_unhealthy
        changed = self._inventory.replace(
            graded(u.id, grades[u.gpu_uuid], u.numa, degraded_unhealthy=unhealthy)
            for u in self._units.values()
            if u.gpu_uuid in grades
        )
        if changed and self.pairing is not None:
            self.pairing.graded(self._inventory.degraded())
        return changed

    def physical_id(self, device_id: str) -> str:
        """A replica's GPU or MIG instance; a whole GPU or MIG instance itself."""
        return self._units[device_id].visible_id

    def allocate(self, device_ids: Sequence[str]) -> ContainerEdits:
        """What the container the kubelet gives these devices gets; the request is
        checked against the sharing rules first (failRequestsGreaterThanOne)."""
        one_only = self.plan.replicated and self._options.fail_requests_greater_than_one
        if one_only and len(device_ids) > 1:
            raise AllocationError(
                Code.INVALID_ARGUMENT,
                f"{self._name}: a container may get at most one shared device, "
                f"asked for {len(device_ids)} ({', '.join(device_ids)})",
            )
        if self.pairing is not None:
            self.pairing.allocated(device_ids)
        return self.edits(device_ids)

    def edits(self, device_ids: Sequence[str]) -> ContainerEdits:
        """What a container gets for these units together, and each unit's device nodes;
        kept per set of devices in the order given, as it depends on nothing else for the
        life of this resource (a reload makes a new one)."""
        return self._answers.get(device_ids)

    def _edits(self, device_ids: Sequence[str]) -> ContainerEdits:
        units = [self._units[i] for i in device_ids]
        return gpu_edits(self._name, units, self._options.flags, self._nodes)

    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        """The best `size` devices; Degraded ones only where Healthy ones are too few."""
        degraded = self._inventory.degraded(available)
        if self.pairing is not None and self.whole_gpus and not self.plan.replicated:
            expired = budget.deadline(self._clock, budget.PREFERRED_ALLOCATION_S)
            costs = self._costs()
            paired = self.pairing.prefer(
                available, must_include, size, costs, expired=expired, degraded=degraded
            )
            if paired is not None:
                return paired
        available, must_include = healthy_first(available, must_include, size, degraded)
        if self.plan.replicated:
            return self._spread(available, must_include, size)
        if not self.whole_gpus:
            return self._pack_mig(available, must_include, size)
        expired = budget.deadline(self._clock, budget.PREFERRED_ALLOCATION_S)
        costs = self._costs()
        return gpu_choice.choose(available, must_include, size, costs, expired=expired)

    def _costs(self) -> PairCosts:
        """NVLinks, then PCIe distance, as one cost per pair of units (lower is better);
        built on first use, as the units never change."""
        if self._pair_costs is None:
            gpu = {u.id: u.gpu_uuid for u in self._units.values()}
            nvlinks = {
                frozenset((a, b)): self._nvlinks.get(frozenset((gpu[a], gpu[b])), 0)
                for a in gpu
                for b in gpu
                if a < b
            }
            self._pair_costs = gpu_choice.gpu_pair_costs(
                gpu, nvlinks, lambda a, b: self._pcie(gpu[a], gpu[b])
            )
        return self._pair_costs

    def _spread(self, available: Sequence[str], must: Sequence[str], size: int) -> list[str]:
        if self._replicas is None:
            self._replicas = _Replicas(self._units.values())
        replicas = self._replicas
        gpu_of = replicas.gpu_of
        free = Counter(map(gpu_of.__getitem__, available))
        in_use = {gpu: len(order) - free[gpu] for gpu, order in replicas.order.items()}
        offered = set(available).difference(must)
        want = size - len(must)
        free_by_gpu = {
            gpu: list(islice((r for r in order if r in offered), want))
            for gpu, order in replicas.order.items()
        }
        packed = self._options.flags.shared_devices_allocation_policy == "packed"
        return gpu_choice.spread_over(
            free_by_gpu, must, size, gpu_of=gpu_of.__getitem__, in_use=in_use, packed=packed
        )

    def _pack_mig(self, available: Sequence[str], must: Sequence[str], size: int) -> list[str]:
        # Fill GPUs that already have the fewest free instances: keeps other GPUs whole.
        free = Counter(self._units[i].gpu_uuid for i in available)
        rest = sorted(
            (i for i in available if i not in must),
            key=lambda i: (free[self._units[i].gpu_uuid], self._units[i].gpu_uuid, i),
        )
        return [*must, *rest[: size - len(must)]]


class _Replicas:
    """Which GPU each replica is on, and each GPU's replicas by number (fixed per plan)."""

    def __init__(self, units: Iterable[Unit]) -> None:
        self.gpu_of = {u.id: u.gpu_uuid for u in units}
        self.order: dict[str, list[str]] = {}
        for replica in sorted(self.gpu_of, key=gpu_choice.replica_order):
            self.order.setdefault(self.gpu_of[replica], []).append(replica)
