"""LLDP neighbours heard on the host's own netdevs (agents.hw.lldp.NeighbourSource).

Placeholder that hears nothing, so the family and the agent can be wired to the Protocol
while the receiver is written."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from agents.hw.lldp import Neighbour


class LldpListener:
    """Implements agents.hw.lldp.NeighbourSource."""

    def __init__(self) -> None:
        self._watched: frozenset[str] = frozenset()

    def watch(self, ifnames: Iterable[str]) -> None:
        self._watched = frozenset(ifnames)

    def neighbour(self, ifname: str) -> Neighbour | None:
        return None

    async def next_change(self, timeout_s: float) -> bool:
        await asyncio.sleep(max(timeout_s, 0.0))
        return False

    def close(self) -> None:
        pass
