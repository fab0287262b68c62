"""Versioned state with a wake-up (agents/kernel/versioned.py), and several APIs'
holdings read as one (agents/kernel/handover.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agents.kernel.handover import Together
from agents.kernel.offer import Offer
from agents.kernel.versioned import Versioned


async def test_a_waiter_wakes_on_the_next_bump_and_not_before() -> None:
    state = Versioned()
    waiting = asyncio.create_task(state.wait_newer(state.version))
    await asyncio.sleep(0)
    assert not waiting.done()
    state.bump()
    await asyncio.wait_for(waiting, 1)
    assert state.version == 1
    await asyncio.wait_for(state.wait_newer(0), 1)  # already newer: returns at once


class _Held:
    def __init__(self, held: set[tuple[str, str]]) -> None:
        self.held = held
        self.changes = Versioned()
        self.loaded = 0

    @property
    def version(self) -> int:
        return self.changes.version

    def holds(self, resource: str, device_id: str) -> bool:
        return (resource, device_id) in self.held

    async def wait_newer(self, version: int) -> None:
        await self.changes.wait_newer(version)

    async def load(self, offers: Sequence[Offer]) -> None:
        self.loaded += 1

    async def run(self) -> None:
        self.held.clear()


async def test_together_holds_what_any_holds_and_wakes_on_any_change() -> None:
    a, b = _Held({("r", "1")}), _Held({("r", "2")})
    both = Together([a, b])
    await both.load([])
    assert (a.loaded, b.loaded) == (1, 1)
    assert both.holds("r", "1") and both.holds("r", "2") and not both.holds("r", "3")
    waiting = asyncio.create_task(both.wait_newer(both.version))
    await asyncio.sleep(0)
    assert not waiting.done()
    b.changes.bump()
    await asyncio.wait_for(waiting, 1)
    await both.run()
    assert not both.holds("r", "1") and not both.holds("r", "2")
