"""GPU<->NIC pairing as the device-plugin API does it, wired to the kubelet: the whole-GPU
resource and the NIC resource share one ledger (agents.core.ledger), fed with the
kubelet's device checkpoint before every call and with pod-resources before every
preferred answer (agents.kernel.kubelet_facts).

Made by the API (agents/plugin/api.py) before the families, which get a side each at
construction; each side tells where its devices are once they are discovered, and again
when they change.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import structlog

from agents.core.budget import Expired, never
from agents.core.ledger import GPU, NIC, Event, Ledger
from agents.core.subsets import PairCosts
from agents.core.topology import PciLocation, Topology
from agents.kernel.kubelet_facts import CheckpointFile, PodResources

log = structlog.get_logger(__name__)


class Pairing:
    """The ledger, the facts it is fed with, and where the devices of each kind are."""

    def __init__(self, checkpoint: CheckpointFile, pod_resources: PodResources) -> None:
        self.ledger = Ledger(report=_log_event)
        self._checkpoint = checkpoint
        self._pod_resources = pod_resources
        self._located: dict[str, tuple[str, dict[str, PciLocation]]] = {}
        self._started = False

    @property
    def active(self) -> bool:
        """Both kinds have a resource with located devices."""
        return all(self._located.get(k, ("", {}))[1] for k in (GPU, NIC))

    def resources(self) -> dict[str, str]:
        """Kind -> name of the resource paired, for those that are."""
        return {kind: name for kind, (name, _) in self._located.items()}

    def withdraw(self, kind: str) -> None:
        """Pairing is switched off for this kind (a reloaded config)."""
        self._located.pop(kind, None)

    def located(
        self, kind: str, resource: str, locations: Mapping[str, PciLocation | None]
    ) -> None:
        known = {d: loc for d, loc in locations.items() if loc is not None}
        if self._located.get(kind) == (resource, known):
            return
        self._located[kind] = (resource, known)
        gpus = self._located.get(GPU, ("", {}))[1]
        nics = self._located.get(NIC, ("", {}))[1]
        topology = Topology(gpus, nics)
        if GPU in self._located:
            partners = {g: topology.nearest_nics(g) for g in gpus}
            self.ledger.set_partners(GPU, self._located[GPU][0], partners)
        if NIC in self._located:
            partners = {n: topology.nearest_gpus(n) for n in nics}
            self.ledger.set_partners(NIC, self._located[NIC][0], partners)
        if self._started:
            if self.active:
                self.sync()
            log.info("pairing_devices_changed", kind=kind, resource=resource, devices=sorted(known))

    def start(self, resources: Mapping[str, str]) -> bool:
        """The families have started (`resources`: every resource name -> "whole GPUs",
        "shared or MIG GPUs" or "NICs"): say once what is paired and what is not, and take
        in the checkpoint as it is. True when pairing is on."""
        self._started = True
        paired = set(self.resources().values()) if self.active else set()
        unpaired = {name: what for name, what in resources.items() if name not in paired}
        if not self.active:
            reason = (
                "no NIC with a PCI location yet: pairing starts when one appears"
                if self._located.get(GPU, ("", {}))[1]
                else "no single whole-GPU resource (time-slicing or MIG): GPUs are not paired"
            )
            log.warning("pairing_off", reason=reason, unpaired=unpaired)
            return False
        self.sync()  # the state at start: what containers already hold
        log.info(
            "pairing_enabled",
            paired=self.resources(),
            unpaired=unpaired,
            gpus=len(self._located[GPU][1]),
            nics=len(self._located[NIC][1]),
            pod_resources=str(self._pod_resources.socket) if self._pod_resources.socket else None,
        )
        return True

    def sync(self) -> None:
        """Take in checkpoint renames since the last look."""
        change = self._checkpoint.changes()
        if change is not None:
            self.ledger.checkpoint(*change)

    async def run(self) -> None:
        """Take in each checkpoint rename as it happens, until cancelled."""
        while True:
            read = await self._checkpoint.next_change()
            if read is not None:
                self.ledger.checkpoint(*read)

    async def refresh(self, resource: str) -> None:
        """Before a preferred answer of `resource`: who holds what now, by pod-resources,
        unless the ledger still has what it listed for this container's first resource."""
        kind = next((k for k, (name, _) in self._located.items() if name == resource), None)
        if kind is None or not self.active:
            return
        self.sync()  # an end-of-admission rename before this call ends the container
        if self.ledger.wants_listing(kind):
            self.ledger.pod_resources(await self._pod_resources.list())

    def side(self, kind: str) -> LedgerSide:
        return LedgerSide(self, kind)

    async def close(self) -> None:
        self._checkpoint.close()
        await self._pod_resources.close()


@dataclass(frozen=True)
class LedgerSide:
    """The pairing as one resource sees it: an agents.core.ledger.PairingSide."""

    pairing: Pairing
    kind: str

    def located(self, resource: str, locations: Mapping[str, PciLocation | None]) -> None:
        self.pairing.located(self.kind, resource, locations)

    def graded(self, degraded: Collection[str]) -> None:
        self.pairing.ledger.graded(self.kind, degraded)

    def prefer(
        self,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        costs: PairCosts | None = None,
        *,
        expired: Expired = never,
        degraded: Collection[str] = frozenset(),
    ) -> list[str] | None:
        if not self.pairing.active:
            return None
        self.pairing.sync()
        ledger = self.pairing.ledger
        return ledger.prefer(
            self.kind, available, must_include, size, costs, expired=expired, degraded=degraded
        )

    def allocated(self, ids: Sequence[str]) -> None:
        if self.pairing.active:
            self.pairing.sync()
            self.pairing.ledger.allocated(self.kind, ids)


def _log_event(event: Event) -> None:
    (log.warning if event.warning else log.info)(event.name, **event.data)
