"""Keeps every resource served and registered with the kubelet, across kubelet restarts.

The device-plugin directory is watched with inotify: a new kubelet.sock means a kubelet
(re)start, a deleted socket of ours means the kubelet cleaned the directory; both lead
to a fresh server and a new Register. A ListAndWatch stream the kubelet ends while we
run also leads to a new Register, since the kubelet never reopens it by itself.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import grpc
import structlog

from agents.api import api_pb2 as pb
from agents.api import api_pb2_grpc as pb_grpc
from agents.errors import ConfigError
from agents.hw.inotify import Change, DirectoryWatch, FsEvent
from agents.plugin.resource import Resource
from agents.plugin.server import DevicePluginServer
from agents.plugin.telemetry import NoTelemetry, Telemetry

log = structlog.get_logger(__name__)

KUBELET_SOCKET = "kubelet.sock"
API_VERSION = "v1beta1"
RETRY_INITIAL_S = 0.05
RETRY_MAX_S = 2.0
SUN_PATH_MAX = 107  # bytes of a unix socket path, without the trailing NUL


class PluginManager:
    """Serves `resources` from `plugin_dir` and keeps them registered until stopped."""

    def __init__(
        self,
        plugin_dir: Path,
        resources: Sequence[Resource],
        *,
        telemetry: Telemetry | None = None,
        before_preferred: Mapping[str, Callable[[], Awaitable[None]]] | None = None,
    ) -> None:
        self.plugin_dir = plugin_dir
        self._telemetry = telemetry or NoTelemetry()
        prepare = before_preferred or {}
        self.servers = {
            r.name: DevicePluginServer(
                r,
                plugin_dir,
                on_stream_lost=self._stream_lost,
                telemetry=self._telemetry,
                before_preferred=prepare.get(r.name),
            )
            for r in resources
        }
        paths = [self.kubelet_socket, *(s.socket_path for s in self.servers.values())]
        longest = max(paths, key=lambda p: len(os.fsencode(p)))
        if len(os.fsencode(longest)) > SUN_PATH_MAX:
            raise ConfigError(
                "--device-plugin-dir",
                str(plugin_dir),
                f"a directory short enough for unix socket paths of at most {SUN_PATH_MAX} "
                f"bytes; {longest} is {len(os.fsencode(longest))}",
            )
        self._unregistered: set[str] = set(self.servers)
        self._wake = asyncio.Event()
        self.registrations = 0
        # kubelet.sock's inode at each resource's last Register: a creation event for a
        # kubelet we already registered with (after a lost stream) needs no second Register,
        # which would restart the server and cut the stream that kubelet just opened.
        self._registered_with: dict[str, tuple[int, int]] = {}

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    def _kubelet_inode(self) -> tuple[int, int] | None:
        """Which kubelet.sock is there (an inode number alone may be reused)."""
        try:
            st = os.stat(self.kubelet_socket)
            return st.st_ino, st.st_ctime_ns
        except FileNotFoundError:
            return None

    def _stream_lost(self, resource: str) -> None:
        self._unregistered.add(resource)
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve and register until `stop` is set; then stop every server (sockets removed)."""
        with DirectoryWatch(self.plugin_dir) as watch:
            try:
                for server in self.servers.values():
                    await server.start()
                await self._loop(watch, stop)
            finally:
                for server in self.servers.values():
                    await server.stop()
                log.info("plugins_stopped", resources=sorted(self.servers))

    async def _loop(self, watch: DirectoryWatch, stop: asyncio.Event) -> None:
        delay = RETRY_INITIAL_S
        while not stop.is_set():
            await self._handle(watch.drain())
            if self._unregistered and self.kubelet_socket.exists():
                registered_all = await self._register_pending()
                delay = RETRY_INITIAL_S if registered_all else min(delay * 2, RETRY_MAX_S)
            retry_in = delay if self._unregistered and self.kubelet_socket.exists() else None
            await self._wait(watch, stop, retry_in)

    async def _wait(
        self, watch: DirectoryWatch, stop: asyncio.Event, retry_in: float | None
    ) -> None:
        """Sleep until a directory event, a lost stream, stop, or `retry_in` seconds."""
        self._wake.clear()
        events = asyncio.ensure_future(watch.next_batch())
        others = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            done, _ = await asyncio.wait(
                [events, *others], timeout=retry_in, return_when=asyncio.FIRST_COMPLETED
            )
            if events in done:
                await self._handle(events.result())
        finally:
            for task in [events, *others]:
                task.cancel()

    async def _handle(self, events: list[FsEvent]) -> None:
        for event in events:
            if event.change & Change.DIR_GONE:
                raise RuntimeError(f"device-plugin directory {self.plugin_dir} was removed")
            if event.name == KUBELET_SOCKET and event.change & Change.CREATED:
                log.info("kubelet_socket_created", path=str(self.kubelet_socket))
                kubelet = self._kubelet_inode()
                self._unregistered.update(
                    n
                    for n in self.servers
                    if kubelet is None or self._registered_with.get(n) != kubelet
                )
        for name, server in self.servers.items():
            if not server.socket_present():
                log.warning("plugin_socket_removed", resource=name)
                await server.restart()
                self._unregistered.add(name)

    async def _register_pending(self) -> bool:
        for name in sorted(self._unregistered):
            if not await self._register(self.servers[name]):
                return False
            self._unregistered.discard(name)
        return True

    async def _register(self, server: DevicePluginServer) -> bool:
        name = server.resource.name
        if server.open_streams or not server.socket_present():
            # An old stream ending after a new Register can cut the new endpoint off:
            # serve afresh so every old stream is closed before we register. A starting
            # kubelet may also have removed our socket since the last look; registering
            # it would leave the kubelet dialling nothing until the Register times out.
            await server.restart()
        request = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=server.socket_path.name,
            resource_name=name,
            options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
        )
        kubelet = self._kubelet_inode()
        try:
            async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                await pb_grpc.RegistrationStub(channel).Register(request, timeout=5)
        except grpc.aio.AioRpcError as exc:
            log.warning("register_failed", resource=name, code=exc.code().name, error=exc.details())
            return False
        self.registrations += 1
        if kubelet is not None:
            self._registered_with[name] = kubelet
        self._telemetry.registered(name)
        log.info("registered", resource=name, endpoint=server.socket_path.name)
        return True
