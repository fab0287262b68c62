"""Device-plugin mode's side of a switch between the APIs: the devices that claims in the
agents' DRA checkpoints hold are not advertised until those claims end. Nothing serves
the DRA sockets in this mode, so the kubelet cannot unprepare them: a claim that the
kubelet's pod-resources answer no longer lists has ended, and is unprepared here (out of
the checkpoint, its CDI spec removed). Without that answer the devices stay withheld."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from pathlib import Path

import structlog

from agents.dra.cdi import CdiSpecs
from agents.dra.checkpoint import (
    CHECKPOINT,
    CheckpointError,
    ClaimCheckpoint,
    PreparedClaim,
    decode,
)
from agents.plugin.kubelet_facts import PodResources
from agents.tasks import off_loop

log = structlog.get_logger(__name__)

POLL_S = 5.0  # while a claim is held: how often the kubelet is asked which still run


class DraHoldings:
    """What the DRA checkpoints of `drivers` hold, by (resource, device ID). Used from the
    event loop; `run` keeps it current until nothing is held."""

    def __init__(self, plugins_dir: Path, cdi_root: Path, pod_resources: PodResources) -> None:
        self._plugins_dir = plugins_dir
        self._cdi = CdiSpecs(cdi_root)
        self._pod_resources = pod_resources
        self._claims: dict[str, dict[str, PreparedClaim]] = {}  # driver -> uid -> claim
        self._held: frozenset[str] = frozenset()  # device IDs
        self.version = 0
        self._changed = asyncio.Event()

    def holds(self, resource: str, device_id: str) -> bool:
        """Whether the device (or the GPU a time-slicing replica `<id>::<n>` is of) is
        held by a claim, under whichever resource serves it now (device IDs are UUIDs and
        PCI addresses: one device's the same under any resource name)."""
        return device_id in self._held or device_id.partition("::")[0] in self._held

    async def wait_newer(self, version: int) -> None:
        while self.version <= version:
            await self._changed.wait()

    async def load(self, drivers: Sequence[str]) -> None:
        """Read the drivers' checkpoints (a corrupt one: said, and taken as empty)."""
        for driver in drivers:
            read = functools.partial(self._read, driver)
            self._claims[driver] = await off_loop(read, f"{driver}-dra-checkpoint")
        self._update()
        if self._held:
            log.info(
                "devices_held_by_dra_claims",
                devices=sorted(self._held),
                claims=sum(len(c) for c in self._claims.values()),
                effect="not advertised until those claims end",
            )

    def _read(self, driver: str) -> dict[str, PreparedClaim]:
        path = self._plugins_dir / driver / CHECKPOINT
        try:
            text = path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.warning("dra_checkpoint_unreadable", path=str(path), error=str(exc))
            return {}
        try:
            return decode(text, path)
        except CheckpointError as exc:
            log.warning("dra_checkpoint_unusable", path=str(path), error=str(exc))
            return {}

    def _update(self) -> None:
        held = frozenset(
            d.device_id
            for claims in self._claims.values()
            for claim in claims.values()
            for d in claim.devices
            if not d.admin_access and d.device_id
        )
        if held != self._held:
            self._held = held
            self.version += 1
            self._changed.set()
            self._changed = asyncio.Event()

    async def run(self) -> None:
        """Free the claims that have ended, until none is held."""
        while self._held:
            await asyncio.sleep(POLL_S)
            running = await self._pod_resources.claims()
            if running is None:
                continue  # no answer: withheld all the same (said once by the client)
            for driver, claims in self._claims.items():
                ended = {u: c for u, c in claims.items() if (c.namespace, c.name) not in running}
                if ended:
                    await self._unprepare(driver, ended)
            self._update()
        await self._pod_resources.close()

    async def _unprepare(self, driver: str, ended: dict[str, PreparedClaim]) -> None:
        left = {u: c for u, c in self._claims[driver].items() if u not in ended}
        path = self._plugins_dir / driver / CHECKPOINT
        try:
            await off_loop(lambda: ClaimCheckpoint(path).save(left), f"{driver}-dra-checkpoint")
            for uid in ended:
                await off_loop(
                    functools.partial(self._cdi.remove, driver, uid), f"{driver}-dra-cdi"
                )
        except OSError as exc:
            log.warning("dra_claims_unprepare_failed", driver=driver, error=str(exc))
            return
        self._claims[driver] = left
        for uid, claim in ended.items():
            log.info(
                "dra_claim_ended",
                driver=driver,
                claim=f"{claim.namespace}/{claim.name} ({uid})",
                devices=[d.device for d in claim.devices],
                effect="advertised again",
            )
