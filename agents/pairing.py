"""The pairing ledger: what each container got so far, across the GPU and NIC resources.

The kubelet never says which container a call is for. It does rename its checkpoint
file once per container, after all of that container's devices are allocated; the
plugin manager's directory watch reports each rename here, and pending events are
drained before every decision, so two calls with no rename between them belong to
one container. Without that signal, a resource allocated twice starts a new container.

The kubelet never says when a pod is gone either. The ledger keeps what each container
got; when a device of it is offered as available again, that container's pod has ended,
so its devices of the other kind are free too. A container whose admission failed half
way gets no rename; its devices offered again tell that it is gone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog

from agents.core import pairing
from agents.core.pairing import PairView, Partners
from agents.core.subsets import PairCosts
from agents.core.topology import Topology

if TYPE_CHECKING:
    from agents.gpu.family import GpuFamily
    from agents.plugin.manager import PluginManager
    from agents.roce.family import RoceFamily

log = structlog.get_logger(__name__)

GPU, NIC = "gpu", "nic"
_OTHER = {GPU: NIC, NIC: GPU}


@dataclass
class _Kind:
    partners: Partners
    free: set[str] = field(default_factory=set)
    container: set[str] = field(default_factory=set)
    allocated_at: int = 0  # the Allocate (counted across both kinds) that filled `container`


@dataclass
class _Held:
    """The devices of one earlier container, by kind, while its pod may still run."""

    devices: dict[str, set[str]] = field(default_factory=lambda: {GPU: set(), NIC: set()})


class PairingLedger:
    """Shared by the whole-GPU resource and the NIC resource of one agent."""

    def __init__(
        self,
        gpu_partners: Mapping[str, frozenset[str]],
        nic_partners: Mapping[str, frozenset[str]],
        *,
        sync: Callable[[], None] = lambda: None,
    ) -> None:
        self._kinds = {
            GPU: _Kind(Partners(gpu_partners), set(gpu_partners)),
            NIC: _Kind(Partners(nic_partners), set(nic_partners)),
        }
        self._sync = sync  # drains pending checkpoint events before a decision
        self.checkpoint_seen = False
        self._fallback_logged = False
        self._held: list[_Held] = []  # earlier containers not yet known to be gone
        self.containers = 0
        self._allocations = 0

    def container_done(self) -> None:
        """The kubelet renamed its checkpoint: the current container is complete."""
        self.checkpoint_seen = True
        self._end_container()

    def _end_container(self) -> None:
        self.containers += 1
        held = _Held({name: set(kind.container) for name, kind in self._kinds.items()})
        if any(held.devices.values()):
            self._held.append(held)
        for kind in self._kinds.values():
            kind.container.clear()

    def _released(self, kind: str, ids: set[str]) -> None:
        """Earlier containers holding any of `ids` (of `kind`) are gone: free their devices."""
        gone = [h for h in self._held if h.devices[kind] & ids]
        if not gone:
            return
        self._held = [h for h in self._held if not h.devices[kind] & ids]
        still = {k: set().union(*(h.devices[k] for h in self._held)) for k in self._kinds}
        for held in gone:
            for name, devices in held.devices.items():
                kind_ = self._kinds[name]
                kind_.free.update(devices - still[name] - kind_.container)

    def side(self, kind: str) -> PairingSide:
        return PairingSide(self, kind)

    def prefer(
        self,
        kind: str,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        costs: PairCosts | None,
    ) -> list[str]:
        self._sync()
        this, other = self._kinds[kind], self._kinds[_OTHER[kind]]
        offered = set(available) - set(must_include)
        self._abandoned(kind, offered)
        self._released(kind, offered)
        this.free = offered
        view = PairView(
            partners=this.partners,
            other_free=frozenset(other.free),
            container_other=frozenset(other.container),
            this_free=frozenset(this.free),
        )

        def choose(v: PairView) -> list[str]:
            return pairing.prefer(available, must_include, size, v, costs)

        answer = choose(view)
        return answer if other.container else self._hedged(kind, answer, view, choose)

    def _hedged(
        self, kind: str, answer: list[str], view: PairView, choose: Callable[[PairView], list[str]]
    ) -> list[str]:
        """A container's first resource, where the devices known to be free do not pair
        every device chosen: the kubelet never reports a pod's end, and the ledger learns
        it only when the pod's devices are offered again. A pod that held only the other
        kind may be gone unseen, so its devices may be free: choose towards them too, as
        long as that pairs no fewer devices with partners known to be free."""
        pairs, known = view.partners, view.other_free
        answered = pairing.paired(answer, pairs, known)
        if answered == len(answer):
            return answer
        maybe = self._maybe_free(_OTHER[kind]) - known
        if not maybe:
            return answer
        hopeful = known | maybe
        hedge = choose(dataclasses.replace(view, other_free=hopeful))
        keeps_known = pairing.paired(hedge, pairs, known) >= answered
        gains = pairing.paired(hedge, pairs, hopeful) > pairing.paired(answer, pairs, hopeful)
        return hedge if keeps_known and gains else answer

    def _maybe_free(self, kind: str) -> frozenset[str]:
        """Devices of `kind` held by earlier containers that held nothing of the other
        kind: their pods may have ended without the ledger knowing."""
        other = _OTHER[kind]
        held = (h.devices[kind] for h in self._held if not h.devices[other])
        return frozenset().union(*held) - self._kinds[kind].container

    def _abandoned(self, kind: str, offered: set[str]) -> None:
        """The kubelet offers devices of the current container again: that container's
        admission failed after they were allocated (it renames nothing then), so they are
        free, as are its devices of the other kind allocated before them. Those allocated
        after them belong to the container being admitted now."""
        this, other = self._kinds[kind], self._kinds[_OTHER[kind]]
        if not this.container & offered:
            return
        log.info("pairing_container_abandoned", kind=kind, devices=sorted(this.container))
        for dropped in (this, other) if other.allocated_at < this.allocated_at else (this,):
            dropped.free.update(dropped.container)
            dropped.container.clear()

    def allocated(self, kind: str, ids: Sequence[str]) -> None:
        self._sync()
        this = self._kinds[kind]
        self._allocations += 1
        if this.container:
            # Same resource twice in one container cannot happen: a boundary was missed.
            if not self.checkpoint_seen and not self._fallback_logged:
                log.warning(
                    "pairing_without_checkpoint_signal",
                    detail="the kubelet's checkpoint is not renamed per container here; "
                    "containers are told apart by repeated resources instead",
                )
                self._fallback_logged = True
            self._end_container()
        self._released(kind, set(ids))
        this.container.update(ids)
        this.allocated_at = self._allocations
        this.free.difference_update(ids)


@dataclass(frozen=True)
class PairingSide:
    """The ledger as one resource sees it."""

    ledger: PairingLedger
    kind: str

    def prefer(
        self,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        costs: PairCosts | None = None,
    ) -> list[str]:
        return self.ledger.prefer(self.kind, available, must_include, size, costs)

    def allocated(self, ids: Sequence[str]) -> None:
        self.ledger.allocated(self.kind, ids)


def attach_pairing(
    gpu: GpuFamily | None, roce: RoceFamily | None, manager: PluginManager
) -> PairingLedger | None:
    """Pair the whole-GPU resource with the NIC resource, when the node has both."""
    if gpu is None or roce is None:
        return None
    whole = [r for r in gpu.resources() if r.whole_gpus]
    nics = {n.pci: n.location for n in roce.nics if n.location is not None}
    if len(whole) != 1 or not nics:
        return None
    resource = whole[0]
    by_uuid = {g.uuid: g.location for g in gpu.gpus if g.location is not None}
    units = {d.id: resource.unit(d.id).gpu_uuid for d in resource.inventory.devices}
    gpus = {unit: by_uuid[uuid] for unit, uuid in units.items() if uuid in by_uuid}
    topology = Topology(gpus, nics)
    gpu_partners = {g: topology.nearest_nics(g) for g in gpus}
    nic_partners = {n: topology.nearest_gpus(n) for n in nics}
    ledger = PairingLedger(gpu_partners, nic_partners, sync=manager.sync_directory)
    manager.on_checkpoint = ledger.container_done
    resource.pairing = ledger.side(GPU)
    roce.resources()[0].pairing = ledger.side(NIC)
    log.info(
        "pairing_enabled",
        gpus=len(gpus),
        nics=len(nics),
        pairs={g: sorted(p) for g, p in gpu_partners.items()},
    )
    return ledger
