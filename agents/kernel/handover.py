"""The hand-over between APIs: devices that pods or claims of the API a node served
through before still hold, while another API serves the node. The same interface both
ways: device-plugin pods seen from DRA (agents/plugin/leftovers.py), DRA claims seen
from device plugins (agents/dra/holdings.py). What is held is not offered until freed."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from agents.kernel.catalogue import Withheld
from agents.kernel.offer import Offer
from agents.tasks import first


class Holdings(Withheld, Protocol):
    """What an API's earlier pods or claims hold; `version` grows with every change."""

    async def load(self, offers: Sequence[Offer]) -> None:
        """Read what is held of the devices of `offers`, before they are served."""
        ...

    async def run(self) -> None:
        """Keep it current until nothing is held (or cancelled)."""
        ...


class Together:
    """Several APIs' holdings as one: a device any of them holds is held."""

    def __init__(self, parts: Sequence[Holdings]) -> None:
        self._parts = tuple(parts)

    @property
    def version(self) -> int:
        return sum(p.version for p in self._parts)

    def holds(self, resource: str, device_id: str) -> bool:
        return any(p.holds(resource, device_id) for p in self._parts)

    async def wait_newer(self, version: int) -> None:
        while self.version <= version:
            await first(*(p.wait_newer(p.version) for p in self._parts))

    async def load(self, offers: Sequence[Offer]) -> None:
        for part in self._parts:
            await part.load(offers)

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for part in self._parts:
                group.create_task(part.run())
