"""The one unix-socket server lifecycle both runtimes use (agents/kernel/socket_server.py),
over real gRPC on real sockets: a stale socket replaced, 0600, answering once start()
returns, stop() safe twice and sparing a foreign socket, and served again when deleted."""

from __future__ import annotations

import asyncio
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import grpc
import pytest
import structlog.testing

from agents.api import pluginregistration_pb2 as reg_pb
from agents.api import pluginregistration_pb2_grpc as reg_grpc
from agents.hw.inotify import Change, DirectoryWatch
from agents.kernel.socket_server import UnixServer, keep_serving
from tests.conditions import WAIT, async_wait_until


class _Info(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    async def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb.PluginInfo(type="Test", name="socket-server")


def _add(server: grpc.aio.Server) -> None:
    reg_grpc.add_RegistrationServicer_to_server(_Info(), server)


async def _name(path: Path) -> str:
    """The served name, asked without waiting for the socket to become ready."""
    async with grpc.aio.insecure_channel(f"unix://{path}") as channel:
        info = await reg_grpc.RegistrationStub(channel).GetInfo(
            reg_pb.InfoRequest(), timeout=5, wait_for_ready=False
        )
    return str(info.name)


async def test_a_stale_socket_is_replaced_and_ours_answers_with_mode_0600_once_started(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.sock"
    path.write_text("stale")
    server = UnixServer(path, _add)
    await server.start()
    try:
        assert await _name(path) == "socket-server"
        assert stat.S_ISSOCK(os.stat(path).st_mode)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert server.present() and server.serving  # the stale file (not a socket) is gone
    finally:
        await server.stop()


async def test_stop_is_safe_twice_and_leaves_a_socket_that_is_not_ours(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    server = UnixServer(path, _add)
    await server.start()
    await server.stop()
    await server.stop()
    assert not path.exists() and not server.serving
    await server.start()
    path.unlink()
    path.write_text("someone else's")
    assert not server.present()
    await server.stop()
    assert path.read_text() == "someone else's"


class _Kept:
    def __init__(self, server: UnixServer) -> None:
        self.server = server
        self.restarts = 0

    @property
    def name(self) -> str:
        return "kept"

    def sockets(self) -> Sequence[UnixServer]:
        return [self.server]

    async def restart(self) -> None:
        self.restarts += 1
        await self.server.stop()
        await self.server.start()


async def test_a_deleted_socket_is_served_again(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    kept = _Kept(UnixServer(path, _add))
    await kept.server.start()
    keeping = asyncio.create_task(keep_serving(lambda: [kept], event="test_socket_removed"))
    try:
        # Deleted before or after the watch is set up: either way it is served again.
        path.unlink()
        await async_wait_until(lambda: kept.restarts == 1 and kept.server.present(), 10, "served")
        assert await _name(path) == "socket-server"
    finally:
        keeping.cancel()
        await asyncio.gather(keeping, return_exceptions=True)
        await kept.server.stop()


async def test_a_server_that_stops_spares_the_socket_its_successor_serves_on_the_same_path(
    tmp_path: Path,
) -> None:
    """gRPC unlinks the path it bound when its server shuts down, late and on a thread of
    its own; a successor on the same path (a restart, a new agent beside the old one) must
    not lose its socket to that: each server binds a name of its own and renames it in."""
    path = tmp_path / "s.sock"
    old = UnixServer(path, _add)
    await old.start()
    new = UnixServer(path, _add)
    await new.start()  # replaces the old one's socket file, as a new agent does
    await old.stop()
    try:
        assert new.present(), "the old server's teardown removed its successor's socket"
        assert await _name(path) == "socket-server"
        assert os.listdir(tmp_path) == ["s.sock"]  # no name of its own left behind
    finally:
        await new.stop()
    assert os.listdir(tmp_path) == []


class _Asked(asyncio.Lock):
    """A guard that says when someone asks for it."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = asyncio.Event()

    async def acquire(self) -> Literal[True]:
        self.asked.set()
        return await super().acquire()


async def test_a_socket_its_owner_replaces_under_the_guard_is_left_to_the_owner(
    tmp_path: Path,
) -> None:
    kept = _Kept(UnixServer(tmp_path / "s.sock", _add))
    await kept.server.start()
    guard = _Asked()
    keeping = asyncio.create_task(keep_serving(lambda: [kept], event="test", guard=guard))
    try:
        async with guard:  # the owner restarts its own server
            guard.asked.clear()
            await kept.server.stop()
            await asyncio.wait_for(guard.asked.wait(), WAIT)  # keep_serving saw it missing
            await kept.server.start()
        async with guard:  # after keep_serving's look (the lock is first come, first served)
            assert kept.restarts == 0
    finally:
        keeping.cancel()
        await asyncio.gather(keeping, return_exceptions=True)
        await kept.server.stop()


async def test_what_is_no_longer_kept_when_keep_serving_looks_is_not_served_again(
    tmp_path: Path,
) -> None:
    stays = _Kept(UnixServer(tmp_path / "a.sock", _add))
    goes = _Kept(UnixServer(tmp_path / "b.sock", _add))
    kept = [stays, goes]
    for item in kept:
        await item.server.start()
    guard = _Asked()
    keeping = asyncio.create_task(keep_serving(lambda: kept, event="test", guard=guard))
    try:
        async with guard:
            guard.asked.clear()
            await stays.server.stop()
            await asyncio.wait_for(guard.asked.wait(), WAIT)  # it saw both, and waits
            kept.remove(goes)  # the owner withdraws one meanwhile, and stops it
            await goes.server.stop()
            await stays.server.start()
        async with guard:  # after keep_serving's look
            assert goes.restarts == 0 and not goes.server.present()
            assert stays.restarts == 0 and stays.server.present()
    finally:
        keeping.cancel()
        await asyncio.gather(keeping, return_exceptions=True)
        await stays.server.stop()
        await goes.server.stop()


async def test_other_entries_changing_beside_a_kept_socket_open_no_new_watch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A DRA driver's checkpoint is renamed into the socket's directory on every prepare:
    the watch stays (closing an inotify descriptor blocks the loop for milliseconds) and
    the socket, still there, is left alone; deleted, it is served again."""
    from agents.kernel import socket_server

    made: list[Path] = []

    class Counted(DirectoryWatch):
        def __init__(self, path: Path, changes: Change) -> None:
            made.append(path)
            super().__init__(path, changes)

    monkeypatch.setattr(socket_server, "DirectoryWatch", Counted)
    path = tmp_path / "s.sock"
    kept = _Kept(UnixServer(path, _add))
    await kept.server.start()
    keeping = asyncio.create_task(keep_serving(lambda: [kept], event="test_socket_removed"))
    try:
        await async_wait_until(lambda: made == [tmp_path], WAIT, "the directory watched")
        for n in range(50):  # a checkpoint written the atomic way, fifty times
            (tmp_path / f".checkpoint.{n}.tmp").write_text("{}")
            (tmp_path / f".checkpoint.{n}.tmp").rename(tmp_path / "checkpoint.json")
        (tmp_path / "checkpoint.json").unlink()
        path.unlink()  # and then the socket itself
        await async_wait_until(lambda: kept.restarts == 1 and kept.server.present(), WAIT)
        assert made == [tmp_path]  # one watch throughout
        assert kept.restarts == 1
    finally:
        keeping.cancel()
        await asyncio.gather(keeping, return_exceptions=True)
        await kept.server.stop()


async def test_a_socket_another_process_keeps_taking_is_served_again_ever_more_slowly(
    tmp_path: Path,
) -> None:
    """Two servers on one path (a second agent, say) would take it from each other hundreds
    of times a second: once contended, each restart waits twice as long as the last."""
    path = tmp_path / "s.sock"
    kept = _Kept(UnixServer(path, _add))
    await kept.server.start()
    theirs = UnixServer(path, _add)  # the other agent's server, on the same path

    async def rival() -> None:  # the other agent: serves again whenever the path is ours
        while True:
            if kept.server.present():
                await theirs.stop()
                await theirs.start()
            await asyncio.sleep(0.001)  # its own pace, not a wait on the code under test

    with structlog.testing.capture_logs() as logs:
        keeping = asyncio.create_task(keep_serving(lambda: [kept], event="test_socket_removed"))
        other = asyncio.create_task(rival())
        try:
            await async_wait_until(lambda: kept.restarts >= 1, WAIT, "the first restart")
            began = time.monotonic()
            await async_wait_until(lambda: kept.restarts >= 5, WAIT, "four more")
            took = time.monotonic() - began
            other.cancel()
            await asyncio.gather(other, return_exceptions=True)
            await theirs.stop()  # the other agent gone, its socket with it
            await async_wait_until(kept.server.present, WAIT + 1.6, "served again, alone")
        finally:
            for task in (keeping, other):
                task.cancel()
            await asyncio.gather(keeping, other, return_exceptions=True)
            await kept.server.stop()
            await theirs.stop()
    assert took >= 0.1 + 0.2 + 0.4  # the waits before restarts 3, 4 and 5
    assert [e["name"] for e in logs if e["event"] == "socket_contended"] == ["kept"]
