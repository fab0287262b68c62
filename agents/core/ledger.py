"""The pairing ledger's decisions, from the kubelet's facts: which container is being
admitted, what the others hold, and so which devices of the partner kind are free.

The facts come in as values (a parsed checkpoint and how many times it was renamed, the
pod-resources listing, the calls themselves); reading them is the caller's business.
- Container boundaries: the kubelet renames its checkpoint at the end of each admitted
  container, and also on every ListAndWatch update of any plugin. An update write changes
  RegisteredDevices; an end-of-admission write leaves it as it was. Of the renames since
  the last look, all but one are ends when RegisteredDevices changed, all when it did not.
- Holdings: pod-resources when it answers (a deleted pod is gone from it at once), else
  the checkpoint's entries (they lag pod ends). Either way a container whose devices the
  kubelet offers as available again has ended.
- Without a readable checkpoint, a rename is a boundary and a resource allocated twice
  starts a new container; holdings are then what this ledger saw allocated.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agents.core import pairing
from agents.core.budget import Expired, never
from agents.core.healthy_first import healthy_first
from agents.core.kubelet_checkpoint import Checkpoint
from agents.core.pairing import PairView, Partners
from agents.core.subsets import PairCosts
from agents.core.topology import PciLocation

GPU, NIC = "gpu", "nic"
PAIRED_KINDS = frozenset({GPU, NIC})  # pairing runs when families of both kinds do
OTHER = {GPU: NIC, NIC: GPU}
KINDS = (GPU, NIC)

Holding = dict[str, frozenset[str]]  # kind -> device IDs of one container
Listing = Mapping[tuple[str, str], Mapping[str, Iterable[str]]]  # container -> resource -> IDs


class PairingSide(Protocol):
    """What a resource pairs through: it tells where its devices are, asks for its
    preferred choice (None: pairing is off, choose alone), and reports what it allocated."""

    def located(self, resource: str, locations: Mapping[str, PciLocation | None]) -> None: ...

    def graded(self, degraded: Collection[str]) -> None:
        """Which of the resource's devices are Degraded now: the other kind's choice pairs
        towards these only where nothing Healthy is left."""
        ...

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
        """`degraded`: devices of `available` to choose only where the Healthy ones are
        too few."""
        ...

    def allocated(self, ids: Sequence[str]) -> None: ...


@dataclass
class _Open:
    """The container being admitted: what it got so far, and in which order."""

    devices: dict[str, set[str]] = field(default_factory=lambda: {GPU: set(), NIC: set()})
    at: dict[str, int] = field(default_factory=lambda: {GPU: 0, NIC: 0})

    def __bool__(self) -> bool:
        return any(self.devices.values())


@dataclass(frozen=True)
class Event:
    """Something for the caller to log: a name and its data."""

    name: str
    data: Mapping[str, object]
    warning: bool = True  # else informational


class Ledger:
    """Shared by the whole-GPU resource (kind GPU) and the NIC resource (kind NIC)."""

    def __init__(
        self,
        resources: Mapping[str, str] | None = None,  # kind -> resource name
        partners: Mapping[str, Mapping[str, frozenset[str]]] | None = None,  # kind -> device ->
        *,
        report: Callable[[Event], None] = lambda event: None,
    ) -> None:
        self.resources = dict(resources or {})
        partners = partners or {}
        self._partners = {k: Partners(partners.get(k, {})) for k in KINDS}
        self._report = report
        self._open = _Open()
        self._allocations = 0
        self.containers = 0  # boundaries seen
        self._checkpoint: Checkpoint | None = None
        self._file_readable = True
        self._registered: Mapping[str, frozenset[str]] | None = None
        self._listing: dict[tuple[str, str], Holding] | None = None
        self._listed_at = -1  # allocations seen when pod-resources last answered
        self._own: list[Holding] = []  # closed containers, when the file cannot be read
        self._gone: set[tuple[str, str]] = set()  # containers seen ended, still listed
        self._reported: set[str] = set()
        self._open_keys: set[tuple[str, str]] | None = None  # listed when it opened
        self._doubtful = False  # renames read together may have ended it
        self._degraded: dict[str, frozenset[str]] = {k: frozenset() for k in KINDS}

    def set_partners(
        self, kind: str, resource: str, partners: Mapping[str, frozenset[str]]
    ) -> None:
        """The resource of a kind and its devices' partners: at start, and whenever
        devices come or go (a NIC that appears later gets partners)."""
        self.resources[kind] = resource
        self._partners[kind] = Partners(partners)

    # Facts

    def graded(self, kind: str, degraded: Collection[str]) -> None:
        """The devices of `kind` that are Degraded now: no partner to choose towards."""
        self._degraded[kind] = frozenset(degraded)

    def checkpoint(self, document: Checkpoint | None, writes: int) -> None:
        """The checkpoint as it is now, after `writes` renames since the last call (None:
        unreadable, in a format other than the kubelet's)."""
        if document is None:
            self._once(
                "pairing_checkpoint_unreadable",
                detail="containers are told apart by renames and repeated resources instead",
            )
            self._file_readable, self._checkpoint = False, None
            if writes:
                self._close()
            return
        changed = self._registered is None or document.registered != self._registered
        ends = writes - (1 if changed else 0)
        self._file_readable, self._checkpoint = True, document
        self._registered = document.registered
        if ends <= 0:
            return
        if writes > 1 and self._open and self._open_keys is not None:
            # Renames read together: health flipped and back looks like an end. Let
            # pod-resources say at the next call whether another pod's admission began.
            self._doubtful = True
            return
        self._close()

    def pod_resources(self, listing: Listing | None) -> None:
        """What pod-resources lists now (None: it did not answer)."""
        if listing is None:
            self._listing = None
            return
        kind_of = {name: kind for kind, name in self.resources.items()}
        self._listed_at = self._allocations
        self._listing = {
            key: {kind_of[r]: frozenset(ids) for r, ids in by_resource.items() if r in kind_of}
            for key, by_resource in listing.items()
        }

    def wants_listing(self, kind: str) -> bool:
        """Whether pod-resources must be asked before choosing devices of `kind`. Not at
        the second resource of the container under admission, when the listing taken for
        its first resource is at hand: the kubelet admits one container at a time, so who
        else holds what has not changed but for pods deleted since, and a deleted pod's
        devices of `kind` are offered again, which ends it here too. Asked again whenever
        an end of the container is in doubt."""
        if self._listing is None or self._doubtful:
            return True
        other = OTHER[kind]
        second = bool(self._open.devices[other]) and not self._open.devices[kind]
        # Taken for the call that chose those devices: no allocation came in between.
        return not (second and self._listed_at == self._open.at[other] - 1)

    # Calls

    def allocated(self, kind: str, ids: Sequence[str]) -> None:
        self._settle()
        if not self._open and self._listing is not None:
            self._open_keys = set(self._listing)
        self._allocations += 1
        if self._open.devices[kind]:
            # Same resource twice in one container cannot happen: a boundary was missed.
            self._once(
                "pairing_boundary_missed",
                detail="a resource was allocated twice without an end-of-admission write",
            )
            self._close()
        self._open.devices[kind].update(ids)
        self._open.at[kind] = self._allocations

    def prefer(
        self,
        kind: str,
        available: Sequence[str],
        must_include: Sequence[str],
        size: int,
        costs: PairCosts | None,
        *,
        expired: Expired = never,
        degraded: Collection[str] = frozenset(),
    ) -> list[str]:
        """Once `expired`, the choice searches stop at the best found so far. Devices
        in `degraded` are chosen only where the Healthy ones are too few."""
        self._settle()
        other = OTHER[kind]
        offered = frozenset(available) - frozenset(must_include)
        self._abandoned(kind, offered)
        holdings = self._holdings(kind, offered)
        held = frozenset().union(*(h.get(other, frozenset()) for h in holdings))
        container_other = frozenset(self._open.devices[other])
        view = PairView(
            partners=self._partners[kind],
            # A Degraded partner is chosen last: not one to pair towards.
            other_free=self._healthy(other) - held - container_other - self._degraded[other],
            container_other=container_other,
            this_free=offered,
        )

        # What the kubelet offers says which holders ended (above); the choice itself
        # takes Degraded devices last.
        narrowed, must = healthy_first(available, must_include, size, degraded)

        def choose(v: PairView) -> list[str]:
            return pairing.prefer(narrowed, must, size, v, costs, expired=expired)

        answer = choose(view)
        if container_other or self._listing is not None:
            return answer
        maybe = frozenset().union(*(h.get(other, frozenset()) for h in holdings if not h.get(kind)))
        return self._hedged(answer, view, maybe - container_other, choose)

    # Decisions

    def _settle(self) -> None:
        """A doubtful end is an end when a pod not listed at the container's start is
        listed now: the kubelet has begun admitting it."""
        if not self._doubtful:
            return
        self._doubtful = False
        if self._listing is None or self._open_keys is None or set(self._listing) - self._open_keys:
            self._close()

    def _close(self) -> None:
        self._doubtful, self._open_keys = False, None
        if not self._open:
            return
        self.containers += 1
        if not self._file_readable:
            self._own.append({k: frozenset(v) for k, v in self._open.devices.items()})
        self._open = _Open()

    def _abandoned(self, kind: str, offered: frozenset[str]) -> None:
        """The kubelet offers devices of the container being admitted again: its admission
        failed after they were allocated (no end-of-admission write then), so they are
        free, as are its devices of the other kind allocated before them."""
        this = self._open.devices[kind]
        if not this & offered:
            return
        self._report(Event("pairing_container_abandoned", {"devices": sorted(this)}, False))
        other = OTHER[kind]
        if self._open.at[other] < self._open.at[kind]:
            self._open = _Open()
        else:
            this.clear()

    def _holdings(self, kind: str, offered: frozenset[str]) -> list[Holding]:
        """What the other containers hold, by the best source; those holding a device of
        `kind` that the kubelet offers now have ended, and are left out from now on."""
        if self._listing is not None:
            source: Mapping[tuple[str, str], Holding] = self._listing
        elif self._checkpoint is not None:
            source = self._from_file(self._checkpoint)
        else:
            source = {(str(n), ""): h for n, h in enumerate(self._own)}
        for key, holding in source.items():
            if holding.get(kind, frozenset()) & offered:
                self._gone.add(key)
        if self._listing is None and self._checkpoint is None:
            self._own = [h for n, h in enumerate(self._own) if (str(n), "") not in self._gone]
            self._gone.clear()
            return list(self._own)
        self._gone &= set(source)  # a container no longer listed needs no memory
        return [h for key, h in source.items() if key not in self._gone]

    def _from_file(self, document: Checkpoint) -> dict[tuple[str, str], Holding]:
        by_key: dict[tuple[str, str], Holding] = {}
        for kind, resource in self.resources.items():
            for key, ids in document.holdings.get(resource, {}).items():
                by_key.setdefault(key, {})[kind] = ids
        return by_key

    def _healthy(self, kind: str) -> frozenset[str]:
        every = frozenset(self._partners[kind])
        name = self.resources.get(kind)
        if self._registered is None or name is None or name not in self._registered:
            return every
        return every & self._registered[name]

    def _hedged(
        self,
        answer: list[str],
        view: PairView,
        maybe: frozenset[str],
        choose: Callable[[PairView], list[str]],
    ) -> list[str]:
        """Without pod-resources, a pod that held only the other kind may have ended
        unseen, so its devices may be free: choose towards them too, as long as that
        pairs no fewer devices with partners known to be free."""
        pairs, known = view.partners, view.other_free
        answered = pairing.paired(answer, pairs, known)
        maybe -= known
        if answered == len(answer) or not maybe:
            return answer
        hopeful = known | maybe
        hedge = choose(dataclasses.replace(view, other_free=hopeful))
        keeps_known = pairing.paired(hedge, pairs, known) >= answered
        gains = pairing.paired(hedge, pairs, hopeful) > pairing.paired(answer, pairs, hopeful)
        return hedge if keeps_known and gains else answer

    def _once(self, name: str, **data: object) -> None:
        if name not in self._reported:
            self._reported.add(name)
            self._report(Event(name, data))
