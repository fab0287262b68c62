"""The DRA kubelet stand-in against a tiny driver served here: it registers as the kubelet
does, calls the version it chose, and reads the health stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

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
from tests.standin.dra_kubelet import HEALTH, V1, V1BETA1, DraKubelet, PluginWatcher

DRIVER = "gpu.example.com"


class TinyDriver(reg_grpc.RegistrationServicer, dra_health_pb2_grpc.DRAResourceHealthServicer):  # type: ignore[misc]
    """Registration, one DRA version (`serves`) and health, on two sockets."""

    def __init__(self, root: Path, versions: Sequence[str], serves: str = V1) -> None:
        self.registration = root / "registry" / f"{DRIVER}-reg.sock"
        self.endpoint = root / DRIVER / "dra.sock"
        self.versions = list(versions)
        self.serves = serves
        self.plugin_type = "DRAPlugin"
        self.statuses: list[tuple[bool, str]] = []
        self.requests: list[Any] = []
        self._servers: list[Any] = []

    async def start(self) -> None:
        for path in (self.registration, self.endpoint):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.unlink(missing_ok=True)
        service = grpc.aio.server()
        dra_health_pb2_grpc.add_DRAResourceHealthServicer_to_server(self, service)
        if self.serves == V1:
            dra_pb2_grpc.add_DRAPluginServicer_to_server(_Dra(self, dra_pb2), service)
        else:
            dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
                _Dra(self, dra_v1beta1_pb2), service
            )
        service.add_insecure_port(f"unix://{self.endpoint}")
        registration = grpc.aio.server()
        reg_grpc.add_RegistrationServicer_to_server(self, registration)
        registration.add_insecure_port(f"unix://{self.registration}")
        self._servers = [service, registration]
        for server in self._servers:
            await server.start()

    async def stop(self) -> None:
        for server in self._servers:
            await server.stop(None)
        self.registration.unlink(missing_ok=True)

    async def GetInfo(self, request: Any, context: Any) -> reg_pb2.PluginInfo:
        return reg_pb2.PluginInfo(
            type=self.plugin_type,
            name=DRIVER,
            endpoint=str(self.endpoint),
            supported_versions=self.versions,
        )

    async def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.statuses.append((request.plugin_registered, request.error))
        return reg_pb2.RegistrationStatusResponse()

    async def NodeWatchResources(self, request: Any, context: Any) -> AsyncIterator[Any]:
        for health in (dra_health_pb2.HEALTHY, dra_health_pb2.UNHEALTHY):
            device = dra_health_pb2.DeviceIdentifier(pool_name="node-1", device_name="gpu-0")
            yield dra_health_pb2.NodeWatchResourcesResponse(
                devices=[dra_health_pb2.DeviceHealth(device=device, health=health)]
            )


class _Dra:
    """The DRA service of one version: prepares each claim as one device named after it."""

    def __init__(self, driver: TinyDriver, module: Any) -> None:
        self.driver = driver
        self.module = module

    async def NodePrepareResources(self, request: Any, context: Any) -> Any:
        self.driver.requests.append(request)
        m = self.module
        return m.NodePrepareResourcesResponse(
            claims={
                c.uid: m.NodePrepareResourceResponse(
                    devices=[m.Device(pool_name="node-1", device_name=c.name)]
                )
                for c in request.claims
            }
        )

    async def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        self.driver.requests.append(request)
        m = self.module
        return m.NodeUnprepareResourcesResponse(
            claims={c.uid: m.NodeUnprepareResourceResponse() for c in request.claims}
        )


@pytest.fixture
async def watcher(plugin_dir: Path) -> AsyncIterator[PluginWatcher]:
    watcher = PluginWatcher(plugin_dir / "registry")
    await watcher.start()
    yield watcher
    await watcher.stop()


@pytest.fixture
async def kubelet(watcher: PluginWatcher) -> AsyncIterator[DraKubelet]:
    kubelet = DraKubelet(watcher)
    yield kubelet
    await kubelet.close()


@pytest.mark.parametrize(
    ("versions", "chosen"),
    [
        ([V1, V1BETA1, HEALTH], V1),
        ([HEALTH, "v2.DRAPlugin", V1BETA1, V1], V1BETA1),
    ],
    ids=["v1-first", "v1beta1-first-known"],
)
async def test_registration_takes_the_first_version_the_kubelet_knows_and_calls_it(
    plugin_dir: Path,
    watcher: PluginWatcher,
    kubelet: DraKubelet,
    versions: list[str],
    chosen: str,
) -> None:
    driver = TinyDriver(plugin_dir, versions, serves=chosen)  # the other is UNIMPLEMENTED
    await driver.start()
    try:
        registration = await watcher.registered(DRIVER)
        assert (registration.service, registration.health) == (chosen, True)
        assert registration.endpoint == str(driver.endpoint)
        assert driver.statuses == [(True, "")]
        prepared = await kubelet.prepare(DRIVER, [("ns", "uid-1", "claim-1")])
        assert prepared.claims["uid-1"].devices[0].device_name == "claim-1"
        unprepared = await kubelet.unprepare(DRIVER, [("ns", "uid-1", "claim-1")])
        assert not unprepared.claims["uid-1"].error
        assert [(c.namespace, c.uid, c.name) for c in driver.requests[0].claims] == [
            ("ns", "uid-1", "claim-1")
        ]
    finally:
        await driver.stop()


@pytest.mark.parametrize(
    ("versions", "plugin_type", "error"),
    [
        (["v2.DRAPlugin", HEALTH], "DRAPlugin", "none of services supported"),
        ([V1], "CSIPlugin", "no handler registered for plugin type: CSIPlugin"),
    ],
    ids=["no-known-version", "wrong-type"],
)
async def test_a_plugin_the_kubelet_cannot_use_is_told_why_and_not_registered(
    plugin_dir: Path, watcher: PluginWatcher, versions: list[str], plugin_type: str, error: str
) -> None:
    driver = TinyDriver(plugin_dir, versions)
    driver.plugin_type = plugin_type
    await driver.start()
    try:
        refusals = await watcher.refused()
        assert error in refusals[0].error
        assert driver.statuses == [(False, refusals[0].error)]
        assert DRIVER not in watcher.drivers
    finally:
        await driver.stop()


async def test_a_removed_socket_deregisters_and_a_new_one_registers_again(
    plugin_dir: Path, watcher: PluginWatcher
) -> None:
    driver = TinyDriver(plugin_dir, [V1])
    await driver.start()
    first = await watcher.registered(DRIVER)
    await driver.stop()  # removes its registration socket
    await watcher.gone(DRIVER)
    await driver.start()
    try:
        second = await watcher.registered(DRIVER, after=first.serial)
        assert second.health is False
        assert driver.statuses == [(True, ""), (True, "")]
    finally:
        await driver.stop()


async def test_waiting_for_a_driver_that_never_comes_fails_at_the_deadline(
    watcher: PluginWatcher,
) -> None:
    with pytest.raises(AssertionError, match=r"timed out after 0\.2s"):
        await watcher.registered(DRIVER, 0.2)


async def test_a_watcher_that_crashed_fails_the_waiter_with_its_error(plugin_dir: Path) -> None:
    registry = plugin_dir / "registry"
    watcher = PluginWatcher(registry)
    await watcher.start()
    registry.rmdir()
    registry.write_text("")  # the directory is now a file: scanning it raises
    with pytest.raises(NotADirectoryError):
        await watcher.registered(DRIVER, 30)
    with pytest.raises(NotADirectoryError):  # and at stop: a crash nobody waited on fails too
        await watcher.stop()


async def test_a_socket_made_0600_after_its_bind_is_not_registered_twice(
    plugin_dir: Path, watcher: PluginWatcher
) -> None:
    driver = TinyDriver(plugin_dir, [V1])
    await driver.start()
    try:
        first = await watcher.registered(DRIVER)
        driver.registration.chmod(0o600)
        await watcher.settled()
        assert watcher.drivers[DRIVER] == first
        assert driver.statuses == [(True, "")]
    finally:
        await driver.stop()


async def test_watch_health_yields_what_the_driver_streams(
    plugin_dir: Path, watcher: PluginWatcher, kubelet: DraKubelet
) -> None:
    driver = TinyDriver(plugin_dir, [V1, HEALTH])
    await driver.start()
    try:
        await watcher.registered(DRIVER)
        seen = [r.devices[0].health async for r in kubelet.watch_health(DRIVER)]
        assert seen == [dra_health_pb2.HEALTHY, dra_health_pb2.UNHEALTHY]
    finally:
        await driver.stop()
