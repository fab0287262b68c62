"""The kubelet's side of DRA for tests: its plugin watcher on the registry directory, and
its calls to a registered driver (prepare, unprepare, the health stream), on the wire."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from agents.api import (
    dra_health_pb2,
    dra_health_pb2_grpc,
    dra_pb2,
    dra_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
)
from agents.api import pluginregistration_pb2 as reg_pb2
from agents.api import pluginregistration_pb2_grpc as reg_grpc

PLUGIN_TYPE = "DRAPlugin"
V1 = "v1.DRAPlugin"
V1BETA1 = "v1beta1.DRAPlugin"
HEALTH = "v1alpha1.DRAResourceHealth"
KUBELET_SERVICES = (V1, V1BETA1)  # what a 1.34 kubelet can call
CALL_TIMEOUT_S = 45.0  # the kubelet's deadline on each prepare and unprepare
GET_INFO_TIMEOUT_S = 1.0  # the plugin watcher's deadline on GetInfo
POLL_S = 0.05

Claim = tuple[str, str, str]  # (namespace, UID, name)


@dataclass(frozen=True)
class Registration:
    """A driver as the kubelet registered it. `serial` counts registrations of all drivers,
    so a test can wait for the one after a restart (`registered(..., after=old.serial)`)."""

    driver: str
    endpoint: str
    service: str  # the chosen version, V1 or V1BETA1
    health: bool  # HEALTH among the supported versions
    socket: Path  # the registration socket
    versions: tuple[str, ...]
    serial: int


@dataclass(frozen=True)
class Refusal:
    """A registration the kubelet refused, with the error it notified the plugin of."""

    socket: Path
    driver: str
    error: str


class PluginWatcher:
    """Polls the registry directory for sockets, as the kubelet's watcher sees them: any
    socket whose name does not start with '.'; one replaced by another is registered anew,
    a removed one deregisters its driver. A registration whose RPCs fail is tried again on
    the next poll; one refused (wrong type, no version in common) is not."""

    def __init__(self, registry_dir: Path, *, poll: float = POLL_S) -> None:
        self.registry_dir = registry_dir
        self.poll = poll
        self.drivers: dict[str, Registration] = {}
        self.refusals: list[Refusal] = []
        self.deregistrations = 0
        self.scans = 0
        self._seen: dict[Path, tuple[int, int]] = {}  # socket -> identity handled
        self._serial = 0
        self._change: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.registry_dir.mkdir(parents=True, exist_ok=True)
        self._change = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._run())
        self._task.add_done_callback(self._changed)  # a crash wakes the waiters

    async def stop(self) -> None:
        """Stop polling; raises what crashed the watcher, if it did."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def registered(
        self, driver: str, within: float = 10.0, *, after: int = 0
    ) -> Registration:
        """The driver's registration once there is one with a serial above `after`."""

        def newer() -> bool:
            found = self.drivers.get(driver)
            return found is not None and found.serial > after

        await self._wait(newer, within, f"registration of {driver}")
        return self.drivers[driver]

    async def gone(self, driver: str, within: float = 10.0) -> None:
        await self._wait(lambda: driver not in self.drivers, within, f"{driver} deregistered")

    async def refused(self, count: int = 1, within: float = 10.0) -> list[Refusal]:
        await self._wait(lambda: len(self.refusals) >= count, within, f"{count} refusals")
        return list(self.refusals)

    async def settled(self, within: float = 10.0) -> None:
        """Until a scan that began after this call has ended: the watcher has acted on the
        directory as it is now (for asserting that something did not happen)."""
        target = self.scans + 2  # the scan under way may have listed the directory before
        await self._wait(lambda: self.scans >= target, within, "a full scan")

    async def _wait(self, condition: Callable[[], bool], within: float, what: str) -> None:
        """Until `condition`; a watcher that crashed raises its error here, at once."""
        try:
            async with asyncio.timeout(within):
                while not condition():
                    if self._task is None or self._task.done():
                        self._raise_stopped()
                    assert self._change is not None
                    await asyncio.shield(self._change)  # shared: a timeout cancels one waiter
        except TimeoutError:
            raise AssertionError(f"timed out after {within}s waiting for {what}") from None

    def _raise_stopped(self) -> None:
        if self._task is not None and not self._task.cancelled():
            self._task.result()  # raises what stopped the watcher
        raise RuntimeError("the plugin watcher is not running")

    def _changed(self, _: object = None) -> None:
        change, self._change = self._change, asyncio.get_running_loop().create_future()
        if change is not None:
            change.set_result(None)

    async def _run(self) -> None:
        while True:
            await self._scan()
            self.scans += 1
            self._changed()
            await asyncio.sleep(self.poll)  # polling interval, not synchronisation

    async def _scan(self) -> None:
        present = _sockets(self.registry_dir)
        for path in [p for p in self._seen if p not in present]:
            del self._seen[path]
            self._deregister(path)
        for path, identity in present.items():
            if self._seen.get(path) != identity:
                self._deregister(path)  # replaced: the old plugin is gone
                if await self._register(path):
                    self._seen[path] = identity

    def _deregister(self, socket: Path) -> None:
        for driver, registration in list(self.drivers.items()):
            if registration.socket == socket:
                del self.drivers[driver]
                self.deregistrations += 1
                self._changed()

    async def _register(self, socket: Path) -> bool:
        """False when the plugin did not answer, to be tried again. The driver counts as
        registered once the plugin has been told so: `registered()` implies it knows."""
        try:
            async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
                stub = reg_grpc.RegistrationStub(channel)
                info = await stub.GetInfo(reg_pb2.InfoRequest(), timeout=GET_INFO_TIMEOUT_S)
                error = _refusal(info)
                await stub.NotifyRegistrationStatus(
                    reg_pb2.RegistrationStatus(plugin_registered=not error, error=error),
                    timeout=GET_INFO_TIMEOUT_S,
                )
        except grpc.aio.AioRpcError:
            return False
        if error:
            self.refusals.append(Refusal(socket, info.name, error))
        else:
            self._serial += 1
            self.drivers[info.name] = _registration(info, socket, self._serial)
        self._changed()
        return True


def _sockets(directory: Path) -> dict[Path, tuple[int, int]]:
    """Socket path -> (inode, modification time): another socket at the same path differs,
    while the same socket made 0600 after its bind (a change of ctime) does not."""
    found = {}
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            if entry.name.startswith("."):
                continue
            with contextlib.suppress(FileNotFoundError):
                info = entry.stat(follow_symlinks=False)
                if stat.S_ISSOCK(info.st_mode):
                    found[Path(entry.path)] = (info.st_ino, info.st_mtime_ns)
    return found


def _refusal(info: reg_pb2.PluginInfo) -> str:
    if info.type != PLUGIN_TYPE:
        return f"no handler registered for plugin type: {info.type}"
    if not any(v in KUBELET_SERVICES for v in info.supported_versions):
        return (
            f"none of services supported by the plugin ({list(info.supported_versions)}) "
            f"are supported by the kubelet ({list(KUBELET_SERVICES)})"
        )
    return ""


def _registration(info: reg_pb2.PluginInfo, socket: Path, serial: int) -> Registration:
    versions = tuple(info.supported_versions)
    return Registration(
        driver=info.name,
        endpoint=info.endpoint or str(socket),
        service=next(v for v in versions if v in KUBELET_SERVICES),
        health=HEALTH in versions,
        socket=socket,
        versions=versions,
        serial=serial,
    )


class DraKubelet:
    """Calls registered drivers as the kubelet does: the chosen version's service, one
    channel per registration, the kubelet's deadline on each call."""

    def __init__(self, watcher: PluginWatcher, *, timeout: float = CALL_TIMEOUT_S) -> None:
        self.watcher = watcher
        self.timeout = timeout
        self._channels: dict[int, grpc.aio.Channel] = {}

    async def prepare(self, driver: str, claims: Sequence[Claim]) -> Any:
        """The NodePrepareResourcesResponse (of the chosen version's module)."""
        registration, stub = self._stub(driver)
        module = dra_pb2 if registration.service == V1 else dra_v1beta1_pb2
        request = module.NodePrepareResourcesRequest(claims=_claims(module, claims))
        return await stub.NodePrepareResources(request, timeout=self.timeout)

    async def unprepare(self, driver: str, claims: Sequence[Claim]) -> Any:
        registration, stub = self._stub(driver)
        module = dra_pb2 if registration.service == V1 else dra_v1beta1_pb2
        request = module.NodeUnprepareResourcesRequest(claims=_claims(module, claims))
        return await stub.NodeUnprepareResources(request, timeout=self.timeout)

    async def watch_health(
        self, driver: str
    ) -> AsyncGenerator[dra_health_pb2.NodeWatchResourcesResponse]:
        """The driver's health stream, until the driver ends it (or the caller stops)."""
        channel = self._channel(self._registration(driver))
        call = dra_health_pb2_grpc.DRAResourceHealthStub(channel).NodeWatchResources(
            dra_health_pb2.NodeWatchResourcesRequest()
        )
        try:
            async for response in call:
                yield response
        finally:
            call.cancel()

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close()

    def _registration(self, driver: str) -> Registration:
        registration = self.watcher.drivers.get(driver)
        if registration is None:
            raise LookupError(f"DRA driver {driver} is not registered")
        return registration

    def _stub(self, driver: str) -> tuple[Registration, Any]:
        registration = self._registration(driver)
        channel = self._channel(registration)
        if registration.service == V1:
            return registration, dra_pb2_grpc.DRAPluginStub(channel)
        return registration, dra_v1beta1_pb2_grpc.DRAPluginStub(channel)

    def _channel(self, registration: Registration) -> grpc.aio.Channel:
        channel = self._channels.get(registration.serial)
        if channel is None:
            channel = grpc.aio.insecure_channel(f"unix://{registration.endpoint}")
            self._channels[registration.serial] = channel
        return channel


def _claims(module: Any, claims: Sequence[Claim]) -> list[Any]:
    return [module.Claim(namespace=ns, uid=uid, name=name) for ns, uid, name in claims]
