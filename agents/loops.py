"""Named background loops of the agent, each with its own stop event so that one can be
replaced while the others run (the families on a config reload)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class Loops:
    """Named background loops, each with its own stop event so that one can be replaced;
    a loop that fails is the agent's failure."""

    def __init__(self) -> None:
        self._loops: dict[str, tuple[asyncio.Future[None], asyncio.Event]] = {}
        self._changed = asyncio.Event()
        self._ending: list[asyncio.Future[None]] = []  # replaced, still finishing

    def begin(self, name: str, run: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        stop = asyncio.Event()
        self._loops[name] = (asyncio.ensure_future(run(stop)), stop)
        self._changed.set()

    def replace(self, name: str, run: Callable[[asyncio.Event], Awaitable[None]]) -> None:
        """Begin `name` anew; the one it replaces ends in the background."""
        old = self._loops.pop(name, None)
        if old is not None:
            old[1].set()
            self._ending = [t for t in self._ending if not t.done()] + [old[0]]
        self.begin(name, run)

    async def end(self, name: str) -> None:
        """Stop one loop and wait for it; raises what it failed with."""
        entry = self._loops.pop(name, None)
        if entry is None:
            return
        self._changed.set()
        task, stop = entry
        stop.set()
        await task

    async def end_all(self) -> None:
        entries, self._loops = list(self._loops.values()), {}
        for _, stop in entries:
            stop.set()
        tasks = [*(task for task, _ in entries), *self._ending]
        await asyncio.gather(*tasks, return_exceptions=True)

    async def supervise(self, stop: asyncio.Event) -> None:
        """Until `stop`: raise the failure of any loop; forget loops that just end."""
        while not stop.is_set():
            self._changed.clear()
            waits: list[asyncio.Future[Any]] = [
                asyncio.ensure_future(stop.wait()),
                asyncio.ensure_future(self._changed.wait()),
            ]
            running = {task: name for name, (task, _) in self._loops.items()}
            try:
                done, _ = await asyncio.wait(
                    [*running, *waits], return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for wait in waits:
                    wait.cancel()
            for task in done:
                name = running.get(task)
                entry = self._loops.get(name) if name is not None else None
                if name is None or entry is None or entry[0] is not task:
                    continue  # a wake-up, or a loop ended on purpose by end() or replace()
                del self._loops[name]
                error = task.exception()
                if error is not None:
                    raise error
