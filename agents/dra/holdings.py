"""Device-plugin mode's side of a switch between the APIs: the devices that claims in the
DRA checkpoints hold are not advertised until those claims are unprepared. While any is
held, the drivers are served for the kubelet to unprepare them (a pod with claims ends
only once they are: without a driver it would stay Terminating), and prepare refuses
every claim. A claim that the kubelet's pod-resources answer no longer names has ended
too, and is unprepared here. Once none is held, the drivers' sockets go."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from agents.kernel.kubelet_facts import PodResources
from agents.kernel.offer import Offer
from agents.kernel.versioned import Versioned
from agents.tasks import first, off_loop
from agents.timing import HELD_CLAIMS_POLL_S

if TYPE_CHECKING:  # DRA's code is loaded only where DRA left claims or specs behind
    from agents.dra.claims import Claim
    from agents.dra.driver import ClaimRef, Driver

log = structlog.get_logger(__name__)

REFUSED = "this node serves its devices through device plugins (node-agent --api device-plugin)"


class DraHoldings:
    """What the DRA checkpoints hold, by device ID. Used from the event loop; `run`
    serves the drivers and keeps it current until nothing is held."""

    def __init__(
        self,
        plugins_dir: Path,
        registry_dir: Path,
        cdi_root: Path,
        pod_resources: PodResources,
        *,
        poll_s: float = HELD_CLAIMS_POLL_S,  # while a claim is held: the kubelet asked again
    ) -> None:
        self._plugins_dir = plugins_dir
        self._registry_dir = registry_dir
        self._cdi_root = cdi_root
        self._pod_resources = pod_resources
        self._poll_s = poll_s
        self._drivers: dict[str, Driver] = {}
        self._held: frozenset[str] = frozenset()  # device IDs
        self._missing: set[tuple[str, str]] = set()  # (driver, claim UID) unlisted last time
        self._changes = Versioned()

    def holds(self, resource: str, device_id: str) -> bool:
        """Whether the device (by its physical ID) is held by a claim, under whichever
        resource serves it now (device IDs are UUIDs and PCI addresses: one device's the
        same under any resource name)."""
        return device_id in self._held

    @property
    def version(self) -> int:
        return self._changes.version

    async def wait_newer(self, version: int) -> None:
        await self._changes.wait_newer(version)

    async def load(self, offers: Sequence[Offer]) -> None:
        """Take up the checkpoints of the drivers that would serve `offers`."""
        await self.restore(sorted({o.facts().driver for o in offers}))

    async def restore(self, drivers: Sequence[str]) -> None:
        """Take up the drivers' checkpoints (a corrupt one: kept aside, said, empty)."""
        for name in drivers:
            left = functools.partial(self._left_behind, name)
            if not await off_loop(left, f"{name}-checkpoint"):
                continue  # nothing of DRA's here: nothing held, nothing to clean
            from agents.dra.driver import ClaimStore, Driver

            store = ClaimStore(name, self._plugins_dir, self._cdi_root)
            driver = Driver(name, "", store, _refuse, on_change=self._update)
            await driver.restore()
            self._drivers[name] = driver
        self._update()
        if self._held:
            log.info(
                "devices_held_by_dra_claims",
                devices=sorted(self._held),
                claims=sum(len(d.prepared) for d in self._drivers.values()),
                effect="not advertised until those claims are unprepared",
            )

    def _left_behind(self, driver: str) -> bool:
        """Blocking: whether a DRA mode left this driver's checkpoint or a CDI spec here."""
        if not (self._plugins_dir / driver).is_dir() and not self._cdi_root.is_dir():
            return False  # DRA never ran here: its modules need not even be imported
        from agents.dra.cdi import CdiSpecs
        from agents.dra.claim_checkpoint import CHECKPOINT

        checkpoint = self._plugins_dir / driver / CHECKPOINT
        return checkpoint.exists() or bool(CdiSpecs(self._cdi_root).written(driver))

    def _update(self) -> None:
        held = frozenset(
            d.device_id
            for driver in self._drivers.values()
            for claim in driver.prepared.values()
            for d in claim.devices
            if not d.admin_access and d.device_id
        )
        if held != self._held:
            self._held = held
            self._changes.bump()

    async def run(self) -> None:
        """Serve the drivers that hold claims for the kubelet's unprepare, and free the
        claims whose pods are gone, until none is held."""
        holding = [d for d in self._drivers.values() if d.prepared]
        servers = []
        if holding:
            from agents.dra.server import DriverServer  # DRA's wire: only where claims are held

            servers = [
                DriverServer(d, self._registry_dir, self._plugins_dir, list, Versioned())
                for d in holding
            ]
        try:
            for server in servers:
                await server.start()
            if servers:
                log.info("dra_unprepare_served", drivers=[s.driver.name for s in servers])
            while self._held:
                await first(self.wait_newer(self.version), asyncio.sleep(self._poll_s))
                await self._free_ended()
        finally:
            for server in servers:
                await server.stop()
            await self._pod_resources.close()
        if servers:
            log.info("dra_claims_all_unprepared", effect="every device advertised")

    async def _free_ended(self) -> None:
        """Unprepare the claims that two answers in a row did not name (a kubelet just
        restarted may list no pod for a moment)."""
        running = await self._pod_resources.claims()
        if running is None:
            return  # no answer: the kubelet's own unprepare will come (said once already)
        missing = {
            (driver.name, uid)
            for driver in self._drivers.values()
            for uid, claim in driver.prepared.items()
            if (claim.namespace, claim.name) not in running
        }
        ended, self._missing = missing & self._missing, missing
        for driver in self._drivers.values():
            for uid, claim in list(driver.prepared.items()):
                if (driver.name, uid) in ended:
                    log.info(
                        "dra_claim_ended",
                        driver=driver.name,
                        claim=f"{claim.namespace}/{claim.name} ({uid})",
                    )
                    await driver.forget(uid)


async def _refuse(claim: ClaimRef) -> Claim:
    from agents.dra.claims import ClaimError

    raise ClaimError(f"ResourceClaim {claim.namespace}/{claim.name}: {REFUSED}")
