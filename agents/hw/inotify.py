"""inotify on one directory, read from the asyncio loop without threads or polling."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import inotify_simple

from agents.errors import BackendError


class Change(enum.Flag):
    """The kinds of change a watcher reports for an entry of the directory."""

    CREATED = enum.auto()  # created, or renamed into the directory
    DELETED = enum.auto()  # deleted, or renamed away
    WRITTEN = enum.auto()  # closed after writing
    DIR_GONE = enum.auto()  # the watched directory itself was removed


EVERY_CHANGE = Change.CREATED | Change.DELETED | Change.WRITTEN | Change.DIR_GONE
_MASKS: dict[Change, int] = {
    Change.CREATED: inotify_simple.flags.CREATE | inotify_simple.flags.MOVED_TO,
    Change.DELETED: inotify_simple.flags.DELETE | inotify_simple.flags.MOVED_FROM,
    Change.WRITTEN: inotify_simple.flags.CLOSE_WRITE,
    Change.DIR_GONE: inotify_simple.flags.DELETE_SELF
    | inotify_simple.flags.MOVE_SELF
    | inotify_simple.flags.IGNORED,
}


@dataclass(frozen=True)
class FsEvent:
    name: str  # entry name inside the directory ("" for the directory itself)
    change: Change


class DirectoryWatch:
    """Watch one directory; `await next_batch()` yields the events that arrived."""

    def __init__(self, path: Path, changes: Change = EVERY_CHANGE) -> None:
        self.path = path
        self._inotify = inotify_simple.INotify()
        mask = 0
        for change, bits in _MASKS.items():
            if change & changes:
                mask |= bits
        try:
            self._inotify.add_watch(str(path), mask | inotify_simple.flags.DELETE_SELF)
        except OSError as exc:
            self._inotify.close()
            raise BackendError(f"cannot watch {path}: {exc.strerror}") from exc
        self._queue: asyncio.Queue[list[FsEvent]] = asyncio.Queue()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._inotify.fileno(), self._on_readable)
        self._closed = False
        self._queued = asyncio.Event()

    def _read(self) -> list[FsEvent]:
        out: list[FsEvent] = []
        for event in self._inotify.read(timeout=0):
            for change, bits in _MASKS.items():
                if event.mask & bits:
                    out.append(FsEvent(event.name, change))
        return out

    def poll(self) -> None:
        """Read what the kernel has now, without waiting, and queue it."""
        if self._closed:
            return
        batch = self._read()
        if batch:
            self._queue.put_nowait(batch)
            self._queued.set()

    def _on_readable(self) -> None:
        self.poll()

    async def changed(self) -> None:
        """Wait until events are queued, taking none of them (drain() does)."""
        while self._queue.empty():
            self._queued.clear()
            await self._queued.wait()

    async def next_batch(self) -> list[FsEvent]:
        """Wait for the next batch of events."""
        batch = await self._queue.get()
        return batch + self.drain()

    def drain(self) -> list[FsEvent]:
        """Everything that already happened and was not yet taken, without waiting."""
        self.poll()
        out: list[FsEvent] = []
        while not self._queue.empty():
            out.extend(self._queue.get_nowait())
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.remove_reader(self._inotify.fileno())
        self._inotify.close()

    def __enter__(self) -> DirectoryWatch:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
