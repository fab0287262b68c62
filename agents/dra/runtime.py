"""The DRA runtime: every family served as one DRA driver (`node-agent run --api dra`),
beside agents/plugin and knowing nothing of GPUs or NICs. It keeps each driver's
sockets up, its devices published in ResourceSlices as their health and the kubelet's
device-plugin holdings change, and its prepared claims across restarts."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from agents.core.node_report import DeviceHealth, cause
from agents.dra.claims import Claim
from agents.dra.driver import ClaimRef, Driver, Store
from agents.dra.server import DriverServer
from agents.errors import BackendError
from agents.family import Family
from agents.hw.inotify import Change, DirectoryWatch
from agents.kernel.catalogue import Resource
from agents.kernel.facts import DraDevices
from agents.kernel.kubelet_facts import CheckpointFile, PodResources
from agents.tasks import first

log = structlog.get_logger(__name__)

UNWATCHED_CHECK_S = 2.0  # how often our sockets are looked for when inotify cannot watch
REGISTRATION_WAIT_S = 5.0  # how long slices wait for the kubelet to register the drivers
HELD_POLL_S = 5.0  # while running pods hold devices through device plugins: asked again
STALE_RETRY_S = 30.0  # checkpointed claims of an unreachable API server: asked again


@dataclass(frozen=True)
class DraSettings:
    node: str
    plugins_dir: Path
    registry_dir: Path
    cdi_root: Path
    device_plugin_dir: Path  # the kubelet's device-plugin checkpoint: what pods hold there
    pod_resources_socket: Path | None = None  # the kubelet's answer to the same, if it has one
    device_taints: bool = False


class Slices(Protocol):
    """Publishes each driver's devices, the Unhealthy ones (by name, with their reasons)
    left out or tainted; `set` returns at once, `run` does the requests."""

    def set(self, devices: DraDevices, unhealthy: Mapping[str, str | None]) -> None: ...

    async def run(self) -> None: ...


class Claims(Protocol):
    """The API server's ResourceClaims, for prepare (one GET) and for the claims of the
    checkpoint whose pods may have gone while the agent was away."""

    async def read(self, claim: ClaimRef) -> Claim:
        """The claim, allocated; ClaimError otherwise."""
        ...

    async def gone(self, claim: ClaimRef) -> bool | None:
        """True: no claim of that name and UID; None: the API server did not answer."""
        ...

    async def aclose(self) -> None: ...


StoreFactory = Callable[[str], Store]  # a driver's checkpoint and CDI specs, by driver


class DraRuntime:
    """Serves the families' drivers until cancelled. Used from the event loop."""

    def __init__(
        self,
        settings: DraSettings,
        families: Callable[[], Sequence[Family]],
        slices: Slices,
        claims: Claims,
        stores: StoreFactory,
        *,
        clear_capacity: Callable[[Collection[str]], Coroutine[Any, Any, None]] | None = None,
    ) -> None:
        self.settings = settings
        self._families = families
        self._slices = slices
        self._claims = claims
        self._stores = stores
        # Removes the zeros device plugins of these name prefixes left in the Node's status.
        self._clear_capacity = clear_capacity
        self.drivers: dict[str, Driver] = {}
        self.servers: dict[str, DriverServer] = {}
        self._checkpoint = CheckpointFile(settings.device_plugin_dir)
        self._pod_resources = PodResources(settings.pod_resources_socket)
        self._held_by_pods: frozenset[tuple[str, str]] = frozenset()
        self._health_changed = asyncio.Event()
        self._wake = asyncio.Event()

    def check(self, resources: Sequence[Resource]) -> None:
        """Nothing to refuse beyond what the agent checks (one family per driver)."""

    async def replace(self, resources: Sequence[Resource], unchanged: Collection[str]) -> None:
        """The families changed (a reload): publish what they serve now."""
        self._refresh()
        self._wake.set()

    def serving(self) -> bool:
        return bool(self.servers) and all(s.sockets_present() for s in self.servers.values())

    def withheld(self) -> frozenset[tuple[str, str]]:
        """(resource, device ID) that running pods hold through the device-plugin API."""
        return self._held_by_pods

    async def start(self) -> None:
        """Restore each driver's claims, then serve its sockets and publish its devices."""
        await self._read_device_plugin_holdings()
        for family in self._families():
            name = family.dra().driver
            driver = Driver(
                name,
                self.settings.node,
                self._stores(name),
                self._claims.read,
                withheld=self.withheld,
            )
            await driver.restore()
            self.drivers[name] = driver
        self._refresh()
        for name, driver in self.drivers.items():
            server = DriverServer(
                driver,
                self.settings.registry_dir,
                self.settings.plugins_dir,
                lambda n=name: self._health_of(n),  # type: ignore[misc]
                lambda: self._health_changed,
            )
            await server.start()
            self.servers[name] = server

    async def run(self) -> None:
        try:
            if not self.servers:
                await self.start()
            async with asyncio.TaskGroup() as group:
                group.create_task(self._publish())
                group.create_task(self._follow_devices())
                group.create_task(self._follow_device_plugin_holdings())
                group.create_task(self._keep_sockets())
                group.create_task(self._free_stale_claims())
                if self._clear_capacity is not None:
                    prefixes = {r.name.partition("/")[0] + "/" for r in self._resources()}
                    group.create_task(self._clear_capacity(sorted(prefixes)))
        finally:
            for server in self.servers.values():
                await server.stop()
            await self._pod_resources.close()
            await self._claims.aclose()

    async def _publish(self) -> None:
        """Publish once the kubelet has registered every driver: a device the scheduler
        gives a pod before then cannot be prepared, and the kubelet retries that pod only
        a minute later. Without a kubelet (none answers within REGISTRATION_WAIT_S) the
        slices go out all the same."""
        waits = [s.registered_once.wait() for s in self.servers.values()]
        try:
            async with asyncio.timeout(REGISTRATION_WAIT_S):
                await asyncio.gather(*waits)
        except TimeoutError:
            log.warning(
                "dra_slices_before_registration",
                waited_s=REGISTRATION_WAIT_S,
                unregistered=sorted(n for n, s in self.servers.items() if not s.registered),
            )
        await self._slices.run()

    def _resources(self) -> list[Resource]:
        return [r for f in self._families() for r in f.resources()]

    def _refresh(self) -> None:
        """Tell each driver what it serves now, and the slices what they show."""
        for family in self._families():
            devices = family.dra()
            driver = self.drivers.get(devices.driver)
            if driver is None:
                continue  # not started yet
            resources = {r.name: r for r in family.resources()}
            driver.publish(devices, resources)
            self._slices.set(*self._published(family, devices, resources))
        self._health_changed.set()
        self._health_changed = asyncio.Event()

    def _published(
        self, family: Family, devices: DraDevices, resources: Mapping[str, Resource]
    ) -> tuple[DraDevices, dict[str, str | None]]:
        """The devices to publish (not those running pods hold through the device-plugin
        API) and the Unhealthy ones among them, with their reasons."""
        reasons = {(h.resource, h.device_id): h.reason for h in family.device_health()}
        shown, unhealthy = [], {}
        for device in devices.devices:
            key = (device.resource, device.device_id)
            resource = resources.get(device.resource)
            found = resource.inventory.get(device.device_id) if resource is not None else None
            if found is None or key in self._held_by_pods:
                continue
            shown.append(device)
            if not found.healthy:
                unhealthy[device.name] = reasons.get(key)
        return dataclasses.replace(devices, devices=tuple(shown)), unhealthy

    def _health_of(self, driver: str) -> list[tuple[str, bool, str]]:
        """(device, healthy, why) of each of the driver's devices, for DRAResourceHealth."""
        for family in self._families():
            devices = family.dra()
            if devices.driver != driver:
                continue
            states: dict[tuple[str, str], DeviceHealth] = {
                (h.resource, h.device_id): h for h in family.device_health()
            }
            out = []
            for device in devices.devices:
                state = states.get((device.resource, device.device_id))
                healthy = state is None or state.healthy
                out.append(
                    (
                        device.name,
                        healthy,
                        "" if healthy else cause(state.reason if state else None),
                    )
                )
            return out
        return []

    async def _follow_devices(self) -> None:
        """Publish again whenever a resource's devices or health change."""
        while True:
            inventories = [r.inventory for r in self._resources()]
            versions = [i.version for i in inventories]
            self._wake.clear()
            await first(
                self._wake.wait(),
                *(i.wait_newer(v) for i, v in zip(inventories, versions, strict=True)),
            )
            self._refresh()

    async def _read_device_plugin_holdings(self) -> None:
        """What running pods hold through the device-plugin API: the kubelet's pod-resources
        answer (a deleted pod leaves it at once), else its checkpoint, which keeps the
        entries of ended pods until the next device admission: held for longer, never
        handed out twice."""
        ours = [r.name for r in self._resources()]
        held: set[tuple[str, str]] = set()
        listing = await self._pod_resources.list()
        if listing is not None:
            for by_resource in listing.values():
                held.update((r, d) for r in ours for d in by_resource.get(r, ()))
        else:
            checkpoint = self._checkpoint.read()
            if checkpoint is not None:
                held.update((r, d) for r in ours for d in checkpoint.held(r))
        if held != self._held_by_pods:
            log.info(
                "dra_devices_held_by_device_plugin_pods",
                devices=sorted(f"{r}:{d}" for r, d in held),
                source="pod-resources" if listing is not None else "checkpoint",
                effect="left out of the ResourceSlices until those pods end",
            )
        self._held_by_pods = frozenset(held)

    async def _follow_device_plugin_holdings(self) -> None:
        """Devices given to pods through the device-plugin API come back as those pods
        end. Nothing new is handed out that way in this mode: once none is held, done."""
        while self._held_by_pods:
            await asyncio.sleep(HELD_POLL_S)
            before = self._held_by_pods
            await self._read_device_plugin_holdings()
            if self._held_by_pods != before:
                self._refresh()
        await self._pod_resources.close()

    async def _keep_sockets(self) -> None:
        """Serve again on fresh sockets when ours were removed (the kubelet's plugin
        watcher then registers the driver anew). The directories are watched with
        inotify: nothing runs while the sockets stay."""
        while True:
            dirs = {self.settings.registry_dir} | {s.service.parent for s in self.servers.values()}
            try:
                watches = [DirectoryWatch(d, Change.DELETED | Change.DIR_GONE) for d in dirs]
            except BackendError:  # a directory gone (serving again makes it anew), or no watch
                watches = []
            try:
                if not watches:
                    await asyncio.sleep(UNWATCHED_CHECK_S)
                elif all(s.sockets_present() for s in self.servers.values()):
                    await first(*(w.changed() for w in watches))
                for name, server in self.servers.items():
                    if not server.sockets_present():
                        log.warning("dra_socket_removed", driver=name)
                        await server.restart()
            finally:
                for watch in watches:
                    watch.close()

    async def _free_stale_claims(self) -> None:
        """Claims of the checkpoint whose ResourceClaim is gone (or is another one by
        now) give their devices back; an unreachable API server is asked again later."""
        pending = {(n, uid) for n, d in self.drivers.items() for uid in d.prepared}
        while pending:
            for name, uid in sorted(pending):
                driver = self.drivers[name]
                prepared = driver.prepared.get(uid)
                if prepared is None:
                    pending.discard((name, uid))
                    continue
                claim = ClaimRef(prepared.namespace, uid, prepared.name)
                gone = await self._claims.gone(claim)
                if gone is None:
                    continue
                pending.discard((name, uid))
                if gone:
                    log.info("dra_stale_claim_freed", driver=name, claim=str(claim))
                    await driver.forget(uid)
            if pending:
                await asyncio.sleep(STALE_RETRY_S)
