"""What the RoCE NICs hear of the fabric: each NIC's LLDP neighbour, the node's place
(leaf group, spine) and its labels, followed on the neighbour source's changes."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import structlog

from agents.config import Fabric
from agents.core.fabric_place import Place, fabric_labels, place_of
from agents.hw.lldp import Neighbour, NeighbourSource

log = structlog.get_logger(__name__)

UNKNOWN_AFTER_S = 60.0  # no neighbour on any NIC this long: `fabric_unknown`
IDLE_WAIT_S = 3600.0  # a wait with nothing due; it wakes only for changes


class FabricWatch:
    """The neighbours of the watched netdevs, as last read from `source` (the agent's).

    The node's place waits until every watched NIC has heard its leaf, or UNKNOWN_AFTER_S
    have passed: switches send every 30 s or so, and a leaf group read from the first
    NIC to hear would be a group this node is not in. Per-NIC facts do not wait.

    `fabric_unknown` is logged once when no NIC has heard a neighbour for UNKNOWN_AFTER_S
    since the start or since the last one was lost; `fabric_known` when one is heard
    again, after which a later loss is logged once more."""

    def __init__(
        self,
        source: NeighbourSource | None,
        config: Fabric,
        *,
        clock: Callable[[], float] = time.monotonic,
        unknown_after_s: float = UNKNOWN_AFTER_S,
    ) -> None:
        self._source = source
        self._config = config
        self._spines = config.spine_map
        self._clock = clock
        self._unknown_after_s = unknown_after_s
        self._ifnames: tuple[str, ...] = ()
        self.neighbours: dict[str, Neighbour] = {}  # netdev -> neighbour, while known
        self._unheard_since: float | None = clock()
        self._said_unknown = False
        self._settle_by: float | None = clock() + unknown_after_s  # None: settled

    def watch(self, ifnames: Iterable[str]) -> bool:
        """Listen on exactly these netdevs; True when the neighbours known changed."""
        names = tuple(sorted(set(ifnames)))
        if names != self._ifnames:
            self._ifnames = names
            if self._source is not None:
                self._source.watch(names)
        return self.refresh()

    def refresh(self) -> bool:
        """Read the neighbours again; True when they changed."""
        source = self._source
        heard = {} if source is None else {i: source.neighbour(i) for i in self._ifnames}
        known = {i: n for i, n in heard.items() if n is not None}
        if known == self.neighbours:
            return False
        if known and not self.neighbours:
            self._unheard_since = None
            if self._said_unknown:
                log.info("fabric_known", leaves=sorted({n.leaf for n in known.values()}))
            self._said_unknown = False
        elif self.neighbours and not known:
            self._unheard_since = self._clock()
        self.neighbours = known
        return True

    def place(self) -> Place | None:
        if not self._settled():
            return None
        return place_of((n.leaf for n in self.neighbours.values()), self._spines)

    def _settled(self) -> bool:
        if self._settle_by is not None and (
            set(self.neighbours) >= set(self._ifnames) or self._clock() >= self._settle_by
        ):
            self._settle_by = None
        return self._settle_by is None

    def labels(self) -> dict[str, str]:
        """The node's fabric labels, full names with their own prefixes."""
        return fabric_labels(self.place(), self._config.label_keys)

    def follow(self, earlier: FabricWatch) -> None:
        """Go on from the family this one replaces: its neighbours, and no second
        `fabric_unknown` for one loss."""
        self._unheard_since, self._said_unknown = earlier._unheard_since, earlier._said_unknown
        self._settle_by = earlier._settle_by
        # What the NICs heard stays heard: a reload must not publish them without it.
        self._ifnames, self.neighbours = earlier._ifnames, dict(earlier.neighbours)

    async def run(self, changed: Callable[[], None]) -> None:
        """Follow the source until cancelled; call `changed` when the neighbours change."""
        source = self._source
        if source is None:
            return
        while True:
            settle_by = self._settle_by
            if await source.next_change(self._wait_s()) and self.refresh():
                changed()
            elif settle_by is not None and self._settled():
                changed()  # waited long enough: the place from the NICs that heard
            self._check_unknown()

    def _wait_s(self) -> float:
        due = [] if self._settle_by is None else [self._settle_by]
        if self._unheard_since is not None and not self._said_unknown and self._ifnames:
            due.append(self._unheard_since + self._unknown_after_s)
        return IDLE_WAIT_S if not due else max(0.0, min(due) - self._clock())

    def _check_unknown(self) -> None:
        since = self._unheard_since
        if since is None or self._said_unknown or not self._ifnames:
            return
        if self._clock() - since >= self._unknown_after_s:
            self._said_unknown = True
            log.warning(
                "fabric_unknown",
                nics=list(self._ifnames),
                after_s=self._unknown_after_s,
                effect="no fabric labels; devices served as before",
            )
