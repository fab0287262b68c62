"""One DRA driver as the kubelet meets it: a registration socket in the plugin watcher's
directory and a service socket with DRAPlugin (v1 and v1beta1, the same messages) and
DRAResourceHealth, both 0600 and removed at exit."""

from __future__ import annotations

import asyncio
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
from agents.dra.claim_checkpoint import PreparedClaim
from agents.dra.claims import ClaimError
from agents.dra.driver import ClaimRef, Driver
from agents.kernel.socket_server import UnixServer
from agents.kernel.versioned import Versioned
from agents.tasks import first

log = structlog.get_logger(__name__)

PLUGIN_TYPE = "DRAPlugin"
VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin", "v1alpha1.DRAResourceHealth")


def registration_socket(registry_dir: Path, driver: str) -> Path:
    return registry_dir / f"{driver}-reg.sock"


def service_socket(plugins_dir: Path, driver: str) -> Path:
    return plugins_dir / driver / "dra.sock"


class DriverServer:
    """Serves one driver on its two sockets (agents/kernel/socket_server.py) until stopped."""

    def __init__(
        self,
        driver: Driver,
        registry_dir: Path,
        plugins_dir: Path,
        health: Callable[[], list[tuple[str, bool, str]]],
        health_changes: Versioned,
    ) -> None:
        self.driver = driver
        self.registration = registration_socket(registry_dir, driver.name)
        self.service = service_socket(plugins_dir, driver.name)
        self._health = health  # (device name, healthy, why) of every published device
        self._health_changes = health_changes
        self._service = UnixServer(self.service, self._add_services)
        self._registration = UnixServer(self.registration, self._add_registration)
        self.registered = False
        self.registered_once = asyncio.Event()  # the kubelet has taken the driver
        self._closing = asyncio.Event()

    @property
    def name(self) -> str:
        return self.driver.name

    def _add_services(self, server: grpc.aio.Server) -> None:
        v1_grpc.add_DRAPluginServicer_to_server(_Plugin(self.driver, v1), server)
        v1beta1_grpc.add_DRAPluginServicer_to_server(_Plugin(self.driver, v1beta1), server)
        health_grpc.add_DRAResourceHealthServicer_to_server(_Health(self), server)

    def _add_registration(self, server: grpc.aio.Server) -> None:
        reg_grpc.add_RegistrationServicer_to_server(_Registration(self), server)

    def sockets(self) -> list[UnixServer]:
        return [self._service, self._registration]

    async def start(self) -> None:
        """Service socket first: the kubelet dials it as soon as it sees the registration."""
        self._closing = asyncio.Event()
        self.service.parent.mkdir(parents=True, exist_ok=True)
        self.registration.parent.mkdir(parents=True, exist_ok=True)
        await self._service.start()
        await self._registration.start()
        log.info(
            "dra_driver_serving",
            driver=self.driver.name,
            registration=str(self.registration),
            service=str(self.service),
        )

    def sockets_present(self) -> bool:
        """Both of our own sockets (not stale or foreign ones) are in place."""
        return self._service.present() and self._registration.present()

    async def stop(self) -> None:
        """Stop serving and remove our sockets (registration first). Safe to call twice."""
        self._closing.set()
        await self._registration.stop()
        await self._service.stop()
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
            version = self._health_changes.version
            message = self.health_message()
            listed = [(d.device.device_name, d.health) for d in message.devices]
            if listed != sent:
                sent = listed
                yield message
            await first(self._health_changes.wait_newer(version), closing.wait())


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
            self._server.registered_once.set()
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
