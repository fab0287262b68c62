"""The DRA runtime: every family served as one DRA driver (`node-agent run --api dra`),
standing on agents/kernel and knowing nothing of GPUs or NICs. It keeps each driver's
sockets up, its devices published in ResourceSlices as their health and what another
API's pods still hold change, and its prepared claims across restarts."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Collection, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from agents.core.health import Cause, Grade
from agents.dra.claims import Claim
from agents.dra.driver import ClaimRef, Driver, Store
from agents.dra.server import DriverServer
from agents.dra.slices import causes_of
from agents.errors import ConfigError
from agents.kernel.catalogue import Resource
from agents.kernel.facts import FamilyFacts
from agents.kernel.handover import Holdings
from agents.kernel.offer import Offer
from agents.kernel.socket_server import keep_serving
from agents.kernel.versioned import Versioned
from agents.tasks import first

log = structlog.get_logger(__name__)

REGISTRATION_WAIT_S = 5.0  # how long slices wait for the kubelet to register the drivers
STALE_RETRY_S = 30.0  # checkpointed claims of an unreachable API server: asked again


@dataclass(frozen=True)
class DraSettings:
    node: str
    plugins_dir: Path
    registry_dir: Path
    cdi_root: Path
    device_taints: bool = False
    evict_unhealthy: bool = False  # with device_taints: an Unhealthy device's is NoExecute


class Slices(Protocol):
    """Publishes each driver's devices with their grades, given the causes of those not
    Healthy (by name); `set` returns at once, `run` does the requests."""

    def set(self, devices: FamilyFacts, causes: Mapping[str, Cause]) -> None: ...

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
        families: Callable[[], Sequence[Offer]],
        slices: Slices,
        claims: Claims,
        stores: StoreFactory,
        *,
        clear_capacity: Callable[[Collection[str]], Coroutine[Any, Any, None]] | None = None,
        withheld: Holdings | None = None,
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
        # What pods of another API still hold: not offered until they end.
        self._withheld = withheld
        self._health_changes = Versioned()
        self._wake = asyncio.Event()

    def check(self, offers: Sequence[Offer]) -> None:
        """Raise ConfigError if two families would serve one DRA driver."""
        drivers = [f.facts().driver for f in offers]
        if len(set(drivers)) != len(drivers):
            names = ",".join(f.name for f in offers)
            raise ConfigError("--families", names, "one DRA driver each")

    async def replace(self, offers: Sequence[Offer], unchanged: Collection[str]) -> None:
        """The families changed (a reload): publish what they serve now."""
        self._refresh()
        self._wake.set()
        for driver in self.drivers.values():
            await driver.settle_shares()  # the new families told of the shares held

    def serving(self) -> bool:
        return bool(self.servers) and all(s.sockets_present() for s in self.servers.values())

    def withheld(self, resource: str, device_id: str) -> bool:
        """Whether a running pod holds the device through the device-plugin API."""
        return self._withheld is not None and self._withheld.holds(resource, device_id)

    async def start(self) -> None:
        """Restore each driver's claims, then serve its sockets and publish its devices."""
        for family in self._families():
            name = family.facts().driver
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
        for driver in self.drivers.values():
            await driver.settle_shares()  # e.g. the compute modes of the shares restored
        for name, driver in self.drivers.items():
            server = DriverServer(
                driver,
                self.settings.registry_dir,
                self.settings.plugins_dir,
                lambda n=name: self._health_of(n),  # type: ignore[misc]
                self._health_changes,
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
                group.create_task(keep_serving(self.servers.values, event="dra_socket_removed"))
                group.create_task(self._free_stale_claims())
                if self._clear_capacity is not None:
                    prefixes = {r.name.partition("/")[0] + "/" for r in self._resources()}
                    group.create_task(self._clear_capacity(sorted(prefixes)))
        finally:
            for server in self.servers.values():
                await server.stop()
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
            devices = family.facts()
            driver = self.drivers.get(devices.driver)
            if driver is None:
                continue  # not started yet
            resources = {r.name: r for r in family.resources()}
            driver.publish(devices, resources, family.edits)
            self._slices.set(*self._published(family, devices, resources))
        self._health_changes.bump()

    def _published(
        self, family: Offer, devices: FamilyFacts, resources: Mapping[str, Resource]
    ) -> tuple[FamilyFacts, dict[str, Cause]]:
        """The devices to publish (not those running pods hold through the device-plugin
        API) and the causes of those among them that are not Healthy (Degraded or
        Unhealthy: the kubelet may not see a Degraded device change, the slice does)."""
        causes = causes_of(devices, family.device_health())
        shown, flagged = [], {}
        for device in devices.devices:
            key = (device.resource, device.device_id)
            resource = resources.get(device.resource)
            found = resource.inventory.get(device.device_id) if resource is not None else None
            if found is None or self.withheld(*key):
                continue
            shown.append(device)
            if (cause := causes[device.name]) is not None and cause.grade is not Grade.HEALTHY:
                flagged[device.name] = cause
        return dataclasses.replace(devices, devices=tuple(shown)), flagged

    def _health_of(self, driver: str) -> list[tuple[str, bool, str]]:
        """(device, healthy, why) of each of the driver's devices, for DRAResourceHealth."""
        for family in self._families():
            devices = family.facts()
            if devices.driver == driver:
                causes = causes_of(devices, family.device_health()).items()
                return [
                    (name, c is None or c.grade is not Grade.UNHEALTHY, c.text() if c else "")
                    for name, c in causes
                ]
        return []

    async def _follow_devices(self) -> None:
        """Publish again whenever a resource's devices or health change."""
        while True:
            inventories = [r.inventory for r in self._resources()]
            versions = [i.version for i in inventories]
            self._wake.clear()
            waits = [i.wait_newer(v) for i, v in zip(inventories, versions, strict=True)]
            if self._withheld is not None:  # devices that pods held come back
                waits.append(self._withheld.wait_newer(self._withheld.version))
            await first(self._wake.wait(), *waits)
            self._refresh()

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
