"""Device-plugin mode's leftovers, as another API (DRA) meets them: the devices running
pods hold through device plugins, which it must not offer until those pods end. Nothing
new is handed out that way meanwhile, so once none is held, this is done."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import structlog

from agents.kernel.kubelet_facts import CheckpointFile, PodResources
from agents.kernel.offer import Offer
from agents.kernel.versioned import Versioned
from agents.timing import HELD_PODS_POLL_S

log = structlog.get_logger(__name__)


class PodHoldings:
    """(resource, device ID) that running pods hold through the device-plugin API.
    Used from the event loop."""

    def __init__(
        self,
        device_plugin_dir: Path,
        pod_resources_socket: Path | None,
        *,
        poll_s: float = HELD_PODS_POLL_S,  # while pods hold devices: asked again this often
    ) -> None:
        self._poll_s = poll_s
        self._checkpoint = CheckpointFile(device_plugin_dir)
        self._pod_resources = PodResources(pod_resources_socket)
        self._resources: list[str] = []
        self._held: frozenset[tuple[str, str]] = frozenset()
        self._changes = Versioned()

    @property
    def version(self) -> int:
        return self._changes.version

    async def wait_newer(self, version: int) -> None:
        await self._changes.wait_newer(version)

    def holds(self, resource: str, device_id: str) -> bool:
        return (resource, device_id) in self._held

    async def load(self, offers: Sequence[Offer]) -> None:
        self._resources = [r.name for o in offers for r in o.resources()]
        await self._read()

    async def _read(self) -> None:
        """What running pods hold through the device-plugin API: the kubelet's pod-resources
        answer (a deleted pod leaves it at once), else its checkpoint, which keeps the
        entries of ended pods until the next device admission: held for longer, never
        handed out twice."""
        ours = self._resources
        held: set[tuple[str, str]] = set()
        listing = await self._pod_resources.list()
        if listing is not None:
            for by_resource in listing.values():
                held.update((r, d) for r in ours for d in by_resource.get(r, ()))
        else:
            checkpoint = self._checkpoint.read()
            if checkpoint is not None:
                held.update((r, d) for r in ours for d in checkpoint.held(r))
        if held != self._held:
            log.info(
                "dra_devices_held_by_device_plugin_pods",
                devices=sorted(f"{r}:{d}" for r, d in held),
                source="pod-resources" if listing is not None else "checkpoint",
                effect="left out of the ResourceSlices until those pods end",
            )
            self._held = frozenset(held)
            self._changes.bump()

    async def run(self) -> None:
        """Devices given to pods through the device-plugin API come back as those pods end."""
        try:
            while self._held:
                await asyncio.sleep(self._poll_s)
                await self._read()
        finally:
            await self._pod_resources.close()
