"""The GPU family: builds GPU resources from NVML and keeps their health current."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path

import structlog

from agents.config import Config
from agents.core import xid
from agents.core.ledger import PairingSide
from agents.core.topology import Distance, distance
from agents.errors import BackendError
from agents.gpu.discovery import Gpu, discover, nvlink_counts
from agents.gpu.plan import plan_resources
from agents.gpu.resource import AllocateOptions, GpuResource, whole_gpus
from agents.hw.nvidia_caps import mig_cap_devices
from agents.hw.nvml import Nvml, XidEvent
from agents.hw.sysfs import Sysfs
from agents.plugin.telemetry import NoTelemetry, Telemetry

log = structlog.get_logger(__name__)

PROBE_INTERVAL_S = 1.0  # GPUs that fall off the bus without an event are seen within this


class GpuFamily:
    name = "gpu"

    def __init__(
        self,
        nvml: Nvml,
        sysfs: Sysfs,
        config: Config,
        *,
        config_source: str,
        dev_root: Path | None = None,
        telemetry: Telemetry | None = None,
        pairing: PairingSide | None = None,
    ) -> None:
        self._nvml = nvml
        self._pairing = pairing  # for the whole-GPU resource, when there is exactly one
        self._sysfs = sysfs
        self._config = config
        self._source = config_source
        self._dev_root = "" if dev_root is None else str(dev_root)
        self._telemetry = telemetry or NoTelemetry()
        self.gpus: list[Gpu] = []
        self._resources: list[GpuResource] = []
        self._healthy: dict[str, bool] = {}
        self._pushed: dict[str, bool] | None = None  # what the resources were last given

    def start(self) -> None:
        """Initialise NVML and plan the resources. Raises BackendError or ConfigError."""
        try:
            self._nvml.init()
        except BackendError as exc:
            if self._config.flags.fail_on_init_error:
                raise
            log.warning("gpu_family_disabled", reason=str(exc), setting="failOnInitError=false")
            return
        self.gpus = discover(self._nvml, self._sysfs)
        self._resources = self._build(self.gpus)
        self._healthy = {g.uuid: True for g in self.gpus}
        self._refresh()
        log.info(
            "gpus_discovered", count=len(self.gpus), resources=[r.name for r in self._resources]
        )

    def _build(self, gpus: Sequence[Gpu]) -> list[GpuResource]:
        flags = self._config.flags
        options = AllocateOptions(
            flags=flags,
            fail_requests_greater_than_one=(
                self._config.sharing.time_slicing.fail_requests_greater_than_one
            ),
            minors={g.uuid: g.minor for g in gpus},
            mig_caps=self._mig_caps(gpus) if flags.pass_device_specs else {},
            dev_root=self._dev_root,
        )
        nvlinks = nvlink_counts(gpus)
        by_uuid = {g.uuid: g for g in gpus}

        def pcie(a: str, b: str) -> Distance:
            la, lb = by_uuid[a].location, by_uuid[b].location
            if la is None or lb is None:
                same_numa = by_uuid[a].numa == by_uuid[b].numa
                return Distance.NODE if same_numa else Distance.SYS
            return distance(la, lb)

        plans = plan_resources(gpus, self._config, self._source)
        whole = [p for p in plans if whole_gpus(p)]
        paired = whole[0] if len(whole) == 1 and self._pairing is not None else None
        if self._pairing is not None:  # nothing paired ("") without one whole-GPU resource
            self._pairing.located(
                "" if paired is None else paired.name,
                {}
                if paired is None
                else {u.id: by_uuid[u.gpu_uuid].location for u in paired.units},
            )
        return [
            GpuResource(
                plan,
                options,
                nvlinks=nvlinks,
                pcie=pcie,
                pairing=self._pairing if plan is paired else None,
            )
            for plan in plans
        ]

    def _mig_caps(self, gpus: Sequence[Gpu]) -> dict[str, tuple[str, ...]]:
        """The capability devices of each MIG instance (by MIG UUID) for passDeviceSpecs.
        An instance whose access files cannot be read gets none, and says so."""
        if self._config.flags.mig_strategy == "none":
            return {}
        caps: dict[str, tuple[str, ...]] = {}
        for gpu in gpus:
            for mig in gpu.mig:
                try:
                    caps[mig.uuid] = mig_cap_devices(self._dev_root, gpu.minor, mig)
                except BackendError as exc:
                    log.warning(
                        "mig_capabilities_unreadable",
                        gpu=gpu.uuid,
                        mig=mig.uuid,
                        error=str(exc),
                        effect="its containers get no /dev/nvidia-caps device specs",
                    )
        return caps

    def healthy_count(self) -> int:
        """Physical GPUs that are present and healthy."""
        return sum(1 for ok in self._healthy.values() if ok)

    def resources(self) -> Sequence[GpuResource]:
        return self._resources

    async def run(self, stop: asyncio.Event) -> None:
        if not self._resources:
            return
        # The probe loop awaits NVML alone and is cancelled at stop: a tick then costs one
        # timer, not a task and a wait on two futures, which was most of an idle tick.
        probe = asyncio.ensure_future(self._probe())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([probe, stopped], return_when=asyncio.FIRST_COMPLETED)
            if probe.done():
                probe.result()  # the probe never ends by itself: raise why it did
        finally:
            stopped.cancel()
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe
            self._nvml.shutdown()

    async def _probe(self) -> None:
        while True:
            try:
                events = await self._nvml.next_events(PROBE_INTERVAL_S)
            except BackendError as exc:
                log.error("nvml_events_failed", error=str(exc))
                await asyncio.sleep(PROBE_INTERVAL_S)  # then probe as on any tick
                events = []
            for event in events:
                self._log_xid(event)
            self._refresh()

    def _log_xid(self, event: XidEvent) -> None:
        critical = xid.is_critical(event.xid, self._config.health.disabled_xids)
        log.info("xid_event", gpu=event.uuid, xid=event.xid, critical=critical)

    def _refresh(self) -> None:
        """Probe every GPU; push the health to each resource only when it changed.

        This runs on every probe tick: the probe is O(GPUs), while a push rebuilds the
        device list of every resource (GPUs x replicas), which an idle node never needs.
        """
        healthy: dict[str, bool] = {}
        for gpu in self.gpus:
            try:
                status = self._nvml.status(gpu.uuid)
            except BackendError:
                continue  # gone from NVML: no longer advertised
            ok = xid.gpu_healthy(
                status.lost, status.pending_xids, self._config.health.disabled_xids
            )
            healthy[gpu.uuid] = ok
            self._log_transition(gpu.uuid, ok, status.lost, status.pending_xids)
        for gone in set(self._healthy) - set(healthy):
            log.warning("gpu_removed", gpu=gone)
        self._healthy = healthy
        if healthy == self._pushed:
            return
        self._pushed = dict(healthy)
        for resource in self._resources:
            resource.set_health(healthy)

    def _log_transition(self, uuid: str, ok: bool, lost: bool, pending: frozenset[int]) -> None:
        if self._healthy.get(uuid, True) == ok:
            return
        if ok:
            log.info("device_healthy", gpu=uuid)
            reason = "recovered"
        else:
            reason = xid.unhealthy_reason(lost, pending, self._config.health.disabled_xids) or "?"
            log.warning("device_unhealthy", gpu=uuid, reason=reason)
        for resource in self._resources:
            self._telemetry.health_event(resource.name, reason)
