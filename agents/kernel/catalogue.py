"""What a runtime needs of a family for one resource, and the observable device list."""

from __future__ import annotations

from collections.abc import Iterable, KeysView, Sequence
from typing import Protocol

from agents.core.device import Device
from agents.kernel.edits import ContainerEdits
from agents.kernel.versioned import Versioned


class Inventory(Versioned):
    """The device list of one resource; every change bumps the version and wakes waiters.

    Used from the event loop only.
    """

    def __init__(self, devices: Iterable[Device] = ()) -> None:
        self._devices = tuple(sorted(devices))
        self._by_id = {d.id: d for d in self._devices}  # requests look up every ID they name
        super().__init__()

    @property
    def devices(self) -> tuple[Device, ...]:
        return self._devices

    def get(self, device_id: str) -> Device | None:
        return self._by_id.get(device_id)

    def degraded(self, ids: Iterable[str] | None = None) -> frozenset[str]:
        """Which of `ids` (default: every device) are Degraded; unknown IDs are not."""
        if ids is None:
            return frozenset(d.id for d in self._devices if d.degraded)
        found = (self._by_id.get(i) for i in ids)
        return frozenset(d.id for d in found if d is not None and d.degraded)

    def ids(self) -> KeysView[str]:
        """Every device ID, as a set-like view (membership tests of whole requests at once)."""
        return self._by_id.keys()

    def replace(self, devices: Iterable[Device]) -> bool:
        """Set the list; returns True (and wakes waiters) only when it changed."""
        new = tuple(sorted(devices))
        if new == self._devices:
            return False
        self._devices = new
        self._by_id = {d.id: d for d in new}
        self.bump()
        return True

    def touch(self) -> None:
        """Wake waiters with the list unchanged: what is said of its devices besides the
        list (DRA attributes, node labels) changed. ListAndWatch sends nothing for it."""
        self.bump()


def listed(inventory: Inventory) -> tuple[tuple[str, int | None], ...]:
    """The devices as the kubelet lists them, health aside: IDs and NUMA nodes."""
    return tuple((d.id, d.numa) for d in inventory.devices)


class Resource(Protocol):
    """One advertised resource of a family.

    The runtime has already checked every ID against the inventory (known, healthy,
    no duplicates) and the sizes before it calls allocate or preferred.
    """

    @property
    def name(self) -> str: ...

    @property
    def inventory(self) -> Inventory: ...

    def physical_id(self, device_id: str) -> str:
        """The ID of the device that `device_id` is served from: a replica's GPU or MIG
        instance, else the device itself (what the other API knows it by)."""
        ...

    def allocate(self, device_ids: Sequence[str]) -> ContainerEdits:
        """These devices are given to one container (by the kubelet, one by one): check
        the request against the resource's own rules (AllocationError), note it, and say
        what the container gets."""
        ...

    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]: ...


class Withheld(Protocol):
    """Devices not to advertise for now, though their family has them (held through the
    other API), by resource and physical ID; `version` grows with every change."""

    @property
    def version(self) -> int: ...

    def holds(self, resource: str, device_id: str) -> bool: ...

    async def wait_newer(self, version: int) -> None: ...
