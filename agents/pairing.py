"""GPU<->NIC pairing wired to the kubelet: the whole-GPU resource and the NIC resource share
one ledger (agents.core.ledger), fed with the checkpoint before every call and with
pod-resources before every preferred answer (agents.plugin.kubelet_facts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import structlog

from agents.core.ledger import GPU, NIC, Event, Ledger
from agents.core.subsets import PairCosts
from agents.core.topology import PciLocation, Topology
from agents.plugin.kubelet_facts import CheckpointFile, PodResources

log = structlog.get_logger(__name__)


class Pairing:
    """The ledger and the facts it is fed with."""

    def __init__(
        self,
        resources: Mapping[str, str],  # kind -> resource name
        gpus: Mapping[str, PciLocation],  # device ID of the whole-GPU resource -> location
        nics: Mapping[str, PciLocation],  # NIC device ID -> location
        checkpoint: CheckpointFile,
        pod_resources: PodResources,
    ) -> None:
        self._gpus, self._nics = dict(gpus), dict(nics)
        self.ledger = Ledger(resources, self._partners(), report=_log_event)
        self._checkpoint = checkpoint
        self._pod_resources = pod_resources
        self.sync()  # the state at start: what containers already hold
        log.info(
            "pairing_enabled",
            gpus=len(gpus),
            nics=len(nics),
            pod_resources=str(pod_resources.socket) if pod_resources.socket else None,
        )

    def _partners(self) -> dict[str, dict[str, frozenset[str]]]:
        topology = Topology(self._gpus, self._nics)
        return {
            GPU: {g: topology.nearest_nics(g) for g in self._gpus},
            NIC: {n: topology.nearest_gpus(n) for n in self._nics},
        }

    def nics_changed(self, nics: Mapping[str, PciLocation]) -> None:
        """NICs came or went: pair by the topology as it is now."""
        if dict(nics) == self._nics:
            return
        self._nics = dict(nics)
        partners = self._partners()
        self.ledger.set_partners(GPU, partners[GPU])
        self.ledger.set_partners(NIC, partners[NIC])
        log.info("pairing_nics_changed", nics=sorted(nics))

    def sync(self) -> None:
        """Take in checkpoint renames since the last look."""
        change = self._checkpoint.changes()
        if change is not None:
            self.ledger.checkpoint(*change)

    async def refresh(self) -> None:
        """Before a preferred answer: who holds what now, by pod-resources."""
        self.ledger.pod_resources(await self._pod_resources.list())

    def side(self, kind: str) -> PairingSide:
        return PairingSide(self, kind)

    async def close(self) -> None:
        self._checkpoint.close()
        await self._pod_resources.close()


@dataclass(frozen=True)
class PairingSide:
    """The pairing as one resource sees it."""

    pairing: Pairing
    kind: str

    def prefer(
        self,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        costs: PairCosts | None = None,
    ) -> list[str]:
        self.pairing.sync()
        return self.pairing.ledger.prefer(self.kind, available, must_include, size, costs)

    def allocated(self, ids: Sequence[str]) -> None:
        self.pairing.sync()
        self.pairing.ledger.allocated(self.kind, ids)


def _log_event(event: Event) -> None:
    log.warning(event.name, **event.data)
