"""Keeps every resource served and registered with the kubelet, across kubelet restarts.

The device-plugin directory is watched with inotify: a new kubelet.sock means a kubelet
(re)start, and every resource registers again. A deleted socket of ours (the kubelet
cleaned the directory) is served afresh by the kernel's `keep_serving`, and that resource
registers again. The kubelet's ListAndWatch stream ending while we run also leads to a
new Register, since the kubelet never reopens it by itself; streams of other clients end
without consequence. A resource without devices is neither served nor registered until
it has some. While kubelet.sock is missing, the log says so now and then.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from pathlib import Path

import grpc
import structlog

from agents.api import api_pb2 as pb
from agents.api import api_pb2_grpc as pb_grpc
from agents.config import Flags
from agents.errors import ConfigError
from agents.hw.inotify import Change, DirectoryWatch, FsEvent
from agents.kernel.catalogue import Resource, Withheld
from agents.kernel.offer import Offer
from agents.kernel.socket_server import Socket, keep_serving
from agents.kernel.telemetry import NoTelemetry, Telemetry
from agents.plugin.server import DEFAULT_FLAGS, DevicePluginServer, socket_name
from agents.tasks import first

log = structlog.get_logger(__name__)

KUBELET_SOCKET = "kubelet.sock"
API_VERSION = "v1beta1"
RETRY_INITIAL_S = 0.05
RETRY_MAX_S = 2.0
SUN_PATH_MAX = 107  # bytes of a unix socket path, without the trailing NUL
WAITING_LOG_S = 30.0  # how often a missing kubelet.sock is logged again


class PluginManager:
    """Serves `resources` from `plugin_dir` and keeps them registered until stopped."""

    def __init__(
        self,
        plugin_dir: Path,
        resources: Sequence[Resource],
        *,
        telemetry: Telemetry | None = None,
        before_preferred: Callable[[str], Awaitable[None]] | None = None,
        withheld: Withheld | None = None,
        flags: Callable[[], Flags] = lambda: DEFAULT_FLAGS,
        waiting_log_s: float = WAITING_LOG_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plugin_dir = plugin_dir
        self._flags = flags  # the config's device-list flags, as they are now
        self._telemetry = telemetry or NoTelemetry()
        # Facts to gather (pod-resources) before a resource's preferred answer, by name.
        self._before_preferred = before_preferred
        self._withheld = withheld
        self._waiting_log_s = waiting_log_s
        self._clock = clock
        self._next_waiting_log: float | None = None
        self.servers: dict[str, DevicePluginServer] = {}  # served (and to be registered)
        self.idle: dict[str, DevicePluginServer] = {}  # no devices yet: neither
        self._check(resources)
        for resource in resources:
            self._add(self._server(resource))
        self._unregistered: set[str] = set(self.servers)
        self._wake = asyncio.Event()
        # Held while we restart or stop a served resource, so keep_serving does not take
        # its socket, missing for that moment, as deleted.
        self._restarting = asyncio.Lock()
        self.registrations = 0
        # kubelet.sock's inode at each resource's last Register: a creation event for a
        # kubelet we already registered with (after a lost stream) needs no second Register,
        # which would restart the server and cut the stream that kubelet just opened.
        self._registered_with: dict[str, tuple[int, int]] = {}

    def check(self, offers: Sequence[Offer]) -> None:
        """Raise ConfigError if the families' resources could not be served."""
        self._check([r for o in offers for r in o.resources()])

    def _check(self, resources: Sequence[Resource]) -> None:
        """Raise ConfigError if some resource could not be served from plugin_dir, or two
        would be served under one name."""
        names = [r.name for r in resources]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ConfigError("resource names", twice[0], "one resource of each name; two have it")
        for path in (self.kubelet_socket, *(self._socket(r) for r in resources)):
            if len(os.fsencode(path)) > SUN_PATH_MAX:
                raise ConfigError(
                    "--device-plugin-dir",
                    str(self.plugin_dir),
                    f"a directory short enough for unix socket paths of at most {SUN_PATH_MAX} "
                    f"bytes; {path} is {len(os.fsencode(path))}",
                )

    def _socket(self, resource: Resource) -> Path:
        return self.plugin_dir / socket_name(resource.name)

    def _server(self, resource: Resource) -> DevicePluginServer:
        self._check([resource])
        hook = self._before_preferred
        return DevicePluginServer(
            resource,
            self.plugin_dir,
            on_stream_lost=self._register_again,
            telemetry=self._telemetry,
            before_preferred=None if hook is None else functools.partial(hook, resource.name),
            withheld=self._withheld,
            flags=self._flags,
        )

    def _add(self, server: DevicePluginServer) -> None:
        """File a new server as served, or as idle (with a log line) while it has no devices."""
        name = server.resource.name
        if server.resource.inventory.devices:
            self.servers[name] = server
        else:
            self.idle[name] = server
            log.info("resource_without_devices", resource=name, effect="not registered")

    @property
    def pending(self) -> frozenset[str]:
        """Resources waiting for a Register."""
        return frozenset(self._unregistered)

    def serving(self) -> bool:
        """Every resource that has devices is served."""
        return all(s.serving for s in self.servers.values())

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

    def _register_again(self, resource: str) -> None:
        self._unregistered.add(resource)
        self._wake.set()

    async def run(self) -> None:
        """Serve and register until cancelled; then stop every server (sockets removed)."""
        with DirectoryWatch(self.plugin_dir, Change.CREATED | Change.DIR_GONE) as watch:
            try:
                for server in list(self.servers.values()):
                    await server.start()
                await first(
                    self._loop(watch),
                    keep_serving(self._kept, event="plugin_socket_removed", guard=self._restarting),
                )
            finally:
                for server in list(self.servers.values()):
                    await server.stop()
                log.info("plugins_stopped", resources=sorted(self.servers))

    async def replace(self, offers: Sequence[Offer], unchanged: Collection[str]) -> None:
        """Serve the resources of `offers` from now on. A resource named in `unchanged`
        keeps its server and streams; the others register anew (served afresh if the
        kubelet streams them), and a resource that is no longer there stops being served."""
        wanted = {r.name: r for o in offers for r in o.resources()}
        for name in [n for n in [*self.servers, *self.idle] if n not in wanted]:
            gone = self.servers.pop(name, None) or self.idle.pop(name)
            self._unregistered.discard(name)
            async with self._restarting:
                await gone.stop()
            log.info("resource_withdrawn", resource=name)
        for name, resource in wanted.items():
            server = self.servers.get(name) or self.idle.get(name)
            if server is None:
                new = self._server(resource)
                if resource.inventory.devices:
                    await new.start()  # before keep_serving sees it, which would restart it
                    self._unregistered.add(name)
                self._add(new)
                continue
            register = name in self.servers and name not in unchanged
            server.replace_resource(resource, streams_follow=not register)
            if register:
                self._unregistered.add(name)
        self._wake.set()

    async def _serve_idle(self) -> None:
        """Serve and register the idle resources that have devices by now."""
        for name, server in list(self.idle.items()):
            if server.resource.inventory.devices:
                log.info("resource_has_devices", resource=name)
                await server.start()
                self.servers[name] = self.idle.pop(name)
                self._unregistered.add(name)

    def _kept(self) -> list[_Kept]:
        return [_Kept(self, s) for s in (*self.servers.values(), *self.idle.values())]

    async def _loop(self, watch: DirectoryWatch) -> None:
        delay = RETRY_INITIAL_S
        while True:
            self._handle(watch.drain())
            await self._serve_idle()
            present = self.kubelet_socket.exists()
            if self._unregistered and present:
                registered_all = await self._register_pending()
                delay = RETRY_INITIAL_S if registered_all else min(delay * 2, RETRY_MAX_S)
            retry_in = delay if self._unregistered and present else None
            await self._wait(watch, self._log_waiting(present, retry_in))

    def _log_waiting(self, present: bool, retry_in: float | None) -> float | None:
        """Say that kubelet.sock is missing, now and every waiting_log_s while it stays so;
        returns how long the loop may sleep."""
        if present:
            self._next_waiting_log = None
            return retry_in
        now = self._clock()
        if self._next_waiting_log is None or now >= self._next_waiting_log:
            log.warning(
                "waiting_for_kubelet",
                socket=str(self.kubelet_socket),
                resources=sorted(self.servers),
            )
            self._next_waiting_log = now + self._waiting_log_s
        until_log = self._next_waiting_log - now
        return until_log if retry_in is None else min(retry_in, until_log)

    async def _wait(self, watch: DirectoryWatch, retry_in: float | None) -> None:
        """Sleep until a directory event, a lost stream, devices for an idle resource,
        or `retry_in` seconds."""
        self._wake.clear()
        inventories = [s.resource.inventory for s in self.idle.values()]
        await first(
            self._wake.wait(),
            *(i.wait_newer(i.version) for i in inventories),
            watch.changed(),
            within=retry_in,
        )

    def _handle(self, events: list[FsEvent]) -> None:
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

    async def _register_pending(self) -> bool:
        for name in sorted(self._unregistered):
            server = self.servers.get(name)
            if server is not None and not await self._register(server):
                return False
            self._unregistered.discard(name)
        return True

    async def _register(self, server: DevicePluginServer) -> bool:
        name = server.resource.name
        async with self._restarting:
            if server.open_streams or server.frozen or not server.socket_present():
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
        server.expect_kubelet()  # the kubelet opens its stream once it takes the Register
        try:
            async with grpc.aio.insecure_channel(f"unix://{self.kubelet_socket}") as channel:
                await pb_grpc.RegistrationStub(channel).Register(request, timeout=5)
        except grpc.aio.AioRpcError as exc:
            server.expect_kubelet(False)
            log.warning("register_failed", resource=name, code=exc.code().name, error=exc.details())
            return False
        self.registrations += 1
        if kubelet is not None:
            self._registered_with[name] = kubelet
        self._telemetry.registered(name)
        log.info("registered", resource=name, endpoint=server.socket_path.name)
        return True


class _Kept:
    """A resource as keep_serving sees it. One not served (no devices yet, or withdrawn)
    has no socket to keep: it counts as present, and keeps the directory watched."""

    def __init__(self, manager: PluginManager, server: DevicePluginServer) -> None:
        self._manager = manager
        self._server = server
        self.name = server.resource.name
        self.path = server.socket_path

    def sockets(self) -> Sequence[Socket]:
        return (self,)

    def present(self) -> bool:
        served = self._manager.servers.get(self.name) is self._server
        return not served or self._server.socket_present()

    async def restart(self) -> None:
        """Our socket was deleted (the kubelet cleaned the directory): serve afresh, and
        register again, for the kubelet drops a resource whose socket it removed."""
        plugin_dir = self._manager.plugin_dir
        if not plugin_dir.is_dir():
            raise RuntimeError(f"device-plugin directory {plugin_dir} was removed")
        await self._server.restart()
        self._manager._register_again(self.name)
