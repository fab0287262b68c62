"""One DRA driver as the kubelet meets it: a registration socket in the plugin watcher's
directory and a service socket with DRAPlugin (v1 and v1beta1, the same messages) and
DRAResourceHealth, both 0600 and removed at exit."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import structlog

from agents.api import dra_health_pb2 as health_pb
from agents.api import dra_health_pb2_grpc as health_grpc
from agents.api import dra_pb2 as v1
from agents.api import dra_pb2_grpc as v1_grpc
from agents.api import dra_v1beta1_pb2 as v1beta1
from agents.api import dra_v1beta1_pb2_grpc as v1beta1_grpc
from agents.api import pluginregistration_pb2 as reg_pb
from agents.api import pluginregistration_pb2_grpc as reg_grpc
from agents.dra.checkpoint import PreparedClaim
from agents.dra.claims import ClaimError
from agents.dra.driver import ClaimRef, Driver
from agents.tasks import first

log = structlog.get_logger(__name__)

PLUGIN_TYPE = "DRAPlugin"
VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")
GRACE_S = 0.5


def registration_socket(registry_dir: Path, driver: str) -> Path:
    return registry_dir / f"{driver}-reg.sock"


def service_socket(plugins_dir: Path, driver: str) -> Path:
    return plugins_dir / driver / "dra.sock"


class DriverServer:
    """Serves one driver on its two sockets until stopped."""

    def __init__(
        self,
        driver: Driver,
        registry_dir: Path,
        plugins_dir: Path,
        health: Callable[[], list[tuple[str, bool, str]]],
        health_changed: Callable[[], asyncio.Event],
    ) -> None:
        self.driver = driver
        self.registration = registration_socket(registry_dir, driver.name)
        self.service = service_socket(plugins_dir, driver.name)
        self._health = health  # (device name, healthy, why) of every published device
        self._health_changed = health_changed
        self._servers: list[grpc.aio.Server] = []
        self._inodes: dict[Path, int] = {}
        self.registered = False
        self._closing = asyncio.Event()

    async def start(self) -> None:
        """Service socket first: the kubelet dials it as soon as it sees the registration."""
        self._closing = asyncio.Event()
        self.service.parent.mkdir(parents=True, exist_ok=True)
        self.registration.parent.mkdir(parents=True, exist_ok=True)
        service = grpc.aio.server()
        v1_grpc.add_DRAPluginServicer_to_server(_Plugin(self.driver, v1), service)
        v1beta1_grpc.add_DRAPluginServicer_to_server(_Plugin(self.driver, v1beta1), service)
        health_grpc.add_DRAResourceHealthServicer_to_server(_Health(self), service)
        await self._serve(service, self.service)
        registration = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), registration)
        await self._serve(registration, self.registration)
        log.info(
            "dra_driver_serving",
            driver=self.driver.name,
            registration=str(self.registration),
            service=str(self.service),
        )

    async def _serve(self, server: grpc.aio.Server, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        old_umask = os.umask(0o177)  # 0600 from the bind on
        try:
            server.add_insecure_port(f"unix://{path}")
        finally:
            os.umask(old_umask)
        await server.start()
        os.chmod(path, 0o600)
        self._inodes[path] = os.stat(path).st_ino
        self._servers.append(server)

    def sockets_present(self) -> bool:
        """Both of our own sockets (not stale or foreign ones) are in place."""
        for path, inode in self._inodes.items():
            try:
                if os.stat(path).st_ino != inode:
                    return False
            except FileNotFoundError:
                return False
        return bool(self._inodes)

    async def stop(self) -> None:
        """Stop serving and remove our sockets (registration first). Safe to call twice."""
        self._closing.set()
        servers, self._servers = self._servers, []
        for server in reversed(servers):
            await server.stop(GRACE_S)
        for path in (self.registration, self.service):
            if self._inodes.get(path) is not None:
                with contextlib.suppress(FileNotFoundError):
                    if os.stat(path).st_ino == self._inodes[path]:
                        path.unlink()
        self._inodes.clear()
        self.registered = False

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    def health_message(self) -> health_pb.NodeWatchResourcesResponse:
        now = int(time.time())
        return health_pb.NodeWatchResourcesResponse(
            devices=[
                health_pb.DeviceHealth(
                    device=health_pb.DeviceIdentifier(pool_name=self.driver.pool, device_name=name),
                    health=health_pb.HEALTHY if healthy else health_pb.UNHEALTHY,
                    last_updated_time=now,
                    message=why,
                )
                for name, healthy, why in self._health()
            ]
        )

    async def health_stream(self) -> AsyncIterator[health_pb.NodeWatchResourcesResponse]:
        closing = self._closing
        sent = None
        while not closing.is_set():
            changed = self._health_changed()
            message = self.health_message()
            listed = [(d.device.device_name, d.health) for d in message.devices]
            if listed != sent:
                sent = listed
                yield message
            await first(changed.wait(), closing.wait())


class _Registration(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, server: DriverServer) -> None:
        self._server = server

    async def GetInfo(self, request: Any, context: Any) -> Any:
        return reg_pb.PluginInfo(
            type=PLUGIN_TYPE,
            name=self._server.driver.name,
            endpoint=str(self._server.service),
            supported_versions=list(VERSIONS),
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self._server.registered = request.plugin_registered
        if request.plugin_registered:
            log.info("dra_driver_registered", driver=self._server.driver.name)
        else:
            log.error(
                "dra_driver_registration_failed",
                driver=self._server.driver.name,
                error=request.error,
            )
        return reg_pb.RegistrationStatusResponse()


class _Plugin:
    """DRAPlugin of one version; the messages of v1 and v1beta1 are the same."""

    def __init__(self, driver: Driver, pb: Any) -> None:
        self._driver = driver
        self._pb = pb

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        claims = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
        done = await self._driver.prepare(claims)
        pb = self._pb
        return pb.NodePrepareResourcesResponse(
            claims={uid: self._answer(outcome) for uid, outcome in done.items()}
        )

    def _answer(self, outcome: PreparedClaim | ClaimError) -> Any:
        pb = self._pb
        if isinstance(outcome, ClaimError):
            return pb.NodePrepareResourceResponse(error=str(outcome))
        return pb.NodePrepareResourceResponse(
            devices=[
                pb.Device(
                    request_names=list(d.requests),
                    pool_name=d.pool,
                    device_name=d.device,
                    cdi_device_ids=list(d.cdi_ids),
                )
                for d in outcome.devices
            ]
        )

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        claims = [ClaimRef(c.namespace, c.uid, c.name) for c in request.claims]
        done = await self._driver.unprepare(claims)
        pb = self._pb
        return pb.NodeUnprepareResourcesResponse(
            claims={
                uid: pb.NodeUnprepareResourceResponse(error="" if err is None else str(err))
                for uid, err in done.items()
            }
        )


class _Health(health_grpc.DRAResourceHealthServicer):  # type: ignore[misc]
    def __init__(self, server: DriverServer) -> None:
        self._server = server

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        log.info("dra_health_watch_opened", driver=self._server.driver.name)
        async for message in self._server.health_stream():
            yield message
