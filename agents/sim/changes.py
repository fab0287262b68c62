"""How a simulated source wakes its reader: on a node-file reload, or on a change its host
twin (the real source, for the interfaces that exist on the host) reports."""

from __future__ import annotations

import asyncio
from typing import Protocol

from agents.errors import BackendError

HOST_WAIT_S = 3600.0  # the host follower's wait; it wakes only for real changes


class ChangeSource(Protocol):
    async def next_change(self, timeout_s: float) -> bool: ...


class Changes:
    """`set()` on a reload; `wait(timeout_s)` for the next change of the node or the host.

    Host changes are followed by one long-lived task, started by the first wait, so that
    each wait costs one timer rather than a task per source."""

    def __init__(self, host: ChangeSource | None) -> None:
        self._host = host
        self._changed = asyncio.Event()
        self._taken = asyncio.Event()  # a waiter took the last change
        self._follower: asyncio.Task[None] | None = None
        self._host_error: BackendError | None = None

    def set(self) -> None:
        self._changed.set()

    async def wait(self, timeout_s: float) -> bool:
        """True when something changed within timeout_s; a host failure is raised."""
        if self._host is not None and self._follower is None:
            self._follower = asyncio.create_task(self._follow(self._host))
        if not self._changed.is_set():
            try:
                async with asyncio.timeout(max(timeout_s, 0.0)):
                    await self._changed.wait()
            except TimeoutError:
                return False
        if self._host_error is not None:
            raise self._host_error
        self._changed.clear()
        self._taken.set()
        return True

    async def _follow(self, host: ChangeSource) -> None:
        try:
            while True:
                if await host.next_change(HOST_WAIT_S):
                    self._taken.clear()
                    self._changed.set()
                    await self._taken.wait()  # later changes gather in the host meanwhile
        except BackendError as exc:
            self._host_error = exc
            self._changed.set()

    def close(self) -> None:
        if self._follower is not None and not self._follower.done():
            self._follower.cancel()
