"""Versioned state with a wake-up: a number that grows with every change, and a wait for
a newer one. What a device list, a set of held devices or a health view share."""

from __future__ import annotations

import asyncio


class Versioned:
    """Bumped by the owner of some state on each change; waiters wake on the bump.
    Used from the event loop only."""

    def __init__(self) -> None:
        self._version = 0
        self._changed = asyncio.Event()

    @property
    def version(self) -> int:
        return self._version

    def bump(self) -> None:
        """The state changed: a newer version, every waiter woken."""
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_newer(self, version: int) -> None:
        """Return once the version is newer than `version`."""
        while self._version <= version:
            await self._changed.wait()
