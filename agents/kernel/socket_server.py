"""One gRPC server on one unix socket, the way the kubelet's sockets want it: a stale
socket replaced, mode 0600 from the bind on, `start()` returning only once the socket
answers, `stop()` safe twice; and `keep_serving`, which serves again on a fresh socket
when someone deletes ours (a starting kubelet cleans its directories), noticed by inotify.
Both runtimes create their sockets here and nowhere else.

gRPC unlinks the path it bound when its server shuts down. A server that bound the
socket's own path would so remove the socket of whoever serves there next (our own
restart, a new agent starting beside the old one), and each removal would restart the
next. So every server binds a hidden name of its own in the same directory (the kubelet's
plugin watcher skips dot-files) and renames it into place: gRPC's unlink then only ever
finds its own name gone."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Protocol

import grpc
import structlog

from agents.errors import BackendError
from agents.hw.inotify import Change, DirectoryWatch
from agents.tasks import first

log = structlog.get_logger(__name__)

START_ATTEMPTS = 5
PROBE_S = 2.0  # a served socket answers in milliseconds; longer means it is gone
GRACE_S = 0.5  # how long stopping lets calls in flight finish
UNWATCHED_CHECK_S = 2.0  # how often sockets are looked for when inotify cannot watch
# A socket lost again this soon after it was served anew is contended (another process
# serves on the path: a second agent, say): each restart then waits twice as long, up to
# the most, rather than taking the path back and forth hundreds of times a second.
CONTENDED_S = 2.0
FIRST_BACKOFF_S = 0.1
MOST_BACKOFF_S = 30.0

Servicers = Callable[[grpc.aio.Server], None]  # adds the services to a fresh server


class UnixServer:
    """Serves `servicers` on the unix socket `path`. Used from the event loop."""

    def __init__(self, path: Path, servicers: Servicers) -> None:
        self.path = path
        self._servicers = servicers
        self._server: grpc.aio.Server | None = None
        self._inode: int | None = None

    @property
    def serving(self) -> bool:
        return self._server is not None

    def present(self) -> bool:
        """True while our own socket file (not a stale or foreign one) is in place."""
        try:
            return os.stat(self.path).st_ino == self._inode
        except FileNotFoundError:
            return False

    async def start(self) -> None:
        """Serve on a fresh socket; bind again if someone (a starting kubelet clearing
        its directory) removes it before it answers. RuntimeError if that goes on."""
        for _ in range(START_ATTEMPTS):
            if await self._serve_once():
                return
            # The kubelet clears the directory as it starts; it will not do so twice.
            log.warning("socket_vanished_while_starting", socket=str(self.path))
        raise RuntimeError(f"{self.path} kept vanishing while the server started")

    async def _serve_once(self) -> bool:
        """Bind, serve and probe once; False (and nothing served) if the socket vanished."""
        # Ours alone, and no longer than the path itself (a socket path fits 107 bytes).
        hidden = secrets.token_hex(4)[: max(len(self.path.name) - 1, 6)]
        bound = self.path.with_name(f".{hidden}")
        server = grpc.aio.server()
        self._servicers(server)
        # Created 0600 from the first instant: the umask covers the bind itself.
        old_umask = os.umask(0o177)
        try:
            server.add_insecure_port(f"unix://{bound}")
        finally:
            os.umask(old_umask)
        await server.start()
        self._server = server
        try:
            os.chmod(bound, 0o600)
            self._inode = os.stat(bound).st_ino
            os.replace(bound, self.path)  # a stale socket at the path replaced at once
            await self._wait_answering()
        except (FileNotFoundError, TimeoutError):
            if self.present():
                raise
            await self.stop()
            return False
        return True

    async def _wait_answering(self) -> None:
        async with grpc.aio.insecure_channel(f"unix://{self.path}") as channel:
            async with asyncio.timeout(PROBE_S):
                await channel.channel_ready()

    async def stop(self, grace: float = GRACE_S) -> None:
        """Stop serving and remove our socket (not one put there since). Safe twice."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(grace)
        if self.present():
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        self._inode = None


class Socket(Protocol):
    """A socket as `keep_serving` sees it: where it lives, and whether ours is there."""

    @property
    def path(self) -> Path: ...

    def present(self) -> bool: ...


class Kept(Protocol):
    """Something served on sockets that `keep_serving` watches."""

    @property
    def name(self) -> str: ...

    def sockets(self) -> Sequence[Socket]: ...

    async def restart(self) -> None: ...


async def keep_serving(
    kept: Callable[[], Iterable[Kept]], *, event: str, guard: asyncio.Lock | None = None
) -> None:
    """Serve again whatever of `kept` lost a socket (logged as `event`), until cancelled.
    The sockets' directories are watched with inotify: nothing runs while they stay, and
    other entries' changes (a checkpoint's rename beside a DRA socket, on every prepare)
    wake nothing but a look at the events. An owner that also restarts or stops what it
    keeps holds `guard` meanwhile: a socket it is replacing is missing for a moment, and
    is not ours to serve again."""
    guard = guard or asyncio.Lock()
    watches: dict[Path, DirectoryWatch] = {}  # kept open across wake-ups: closing blocks
    backoff = _Backoff()
    try:
        while True:
            sockets = [s for k in kept() for s in k.sockets()]
            dirs = {s.path.parent for s in sockets}
            _rewatch(watches, dirs)
            if not watches or len(watches) < len(dirs):  # none, or a directory gone
                await asyncio.sleep(UNWATCHED_CHECK_S)
            elif all(s.present() for s in sockets):
                await _socket_gone(watches, {s.path for s in sockets})
            lost = [k.name for k in kept() if not all(s.present() for s in k.sockets())]
            await asyncio.sleep(backoff.wait(lost))  # outside the guard: owners go on
            async with guard:
                for item in list(kept()):  # what is kept now: the owner may have changed it
                    if not all(s.present() for s in item.sockets()):
                        log.warning(event, name=item.name)
                        backoff.restarted(item.name)
                        await item.restart()
    finally:
        for watch in watches.values():
            watch.close()


class _Backoff:
    """How long to wait before serving again what lost its socket: nothing the first
    time, FIRST_BACKOFF_S doubling while it is lost again within CONTENDED_S each time."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float]] = {}  # name -> (restarted at, its wait)

    def wait(self, names: Iterable[str]) -> float:
        now = time.monotonic()
        return max((self._recent(n, now) or 0.0 for n in names), default=0.0)

    def restarted(self, name: str) -> None:
        """Told after the wait, as `name` is served again."""
        now = time.monotonic()
        recent = self._recent(name, now)
        delay = 0.0 if recent is None else min(max(2 * recent, FIRST_BACKOFF_S), MOST_BACKOFF_S)
        if recent is not None and delay == FIRST_BACKOFF_S:
            log.error(
                "socket_contended",
                name=name,
                reason=f"its socket was replaced again within {CONTENDED_S:g} s",
                effect="another process serves on the same path (a second agent?);"
                f" served again after a wait doubling up to {MOST_BACKOFF_S:g} s",
            )
        self._last[name] = (now, delay)

    def _recent(self, name: str, now: float) -> float | None:
        """The wait of `name`'s last restart where that was under CONTENDED_S (beside the
        wait itself) before `now`; None where it was longer ago, or never."""
        last = self._last.get(name)
        if last is None or now - last[0] >= CONTENDED_S + last[1]:
            return None
        return last[1]


def _rewatch(watches: dict[Path, DirectoryWatch], dirs: set[Path]) -> None:
    """Watch each of `dirs` (those that exist), and no other directory."""
    for directory in [d for d in watches if d not in dirs]:
        watches.pop(directory).close()
    for directory in sorted(dirs - watches.keys()):
        with contextlib.suppress(BackendError):
            watches[directory] = DirectoryWatch(
                directory, Change.DELETED | Change.CREATED | Change.DIR_GONE
            )


async def _socket_gone(watches: dict[Path, DirectoryWatch], paths: set[Path]) -> None:
    """Until one of `paths` is deleted, renamed away or replaced (another file renamed
    over it: another server's), or a watched directory goes (its watch then closed: it
    sees nothing more)."""
    while True:
        await first(*(w.changed() for w in watches.values()))
        seen = False
        for directory, watch in list(watches.items()):
            for change in watch.drain():
                if change.change & Change.DIR_GONE:
                    watches.pop(directory).close()
                    seen = True
                    break
                seen = seen or directory / change.name in paths
        if seen:
            return
