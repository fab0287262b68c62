"""The GPU family: builds GPU resources from NVML and keeps their health current."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import structlog

from agents.config import Config
from agents.core.ledger import PairingSide
from agents.core.node_report import DeviceHealth
from agents.core.topology import Distance
from agents.core.xid import GpuHealth, HealthPolicy, is_critical
from agents.errors import BackendError
from agents.gpu.discovery import Gpu, discover, gpu_distance, nvlink_counts
from agents.gpu.plan import Unit, plan_resources
from agents.gpu.resource import AllocateOptions, GpuResource, whole_gpus
from agents.hw.nvidia_caps import mig_cap_devices
from agents.hw.nvml import GpuStatus, Nvml, XidEvent
from agents.hw.nvml_calls import HANG_S, StatusProbe, bounded, waited
from agents.hw.sysfs import Sysfs
from agents.plugin.telemetry import NoTelemetry, Telemetry

log = structlog.get_logger(__name__)

PROBE_INTERVAL_S = 1.0  # GPUs that fall off the bus without an event are seen within this
PROBE_WAIT_S = 0.5  # how long one probe waits for NVML's answers before it moves on
EVENT_WAIT_SLACK_S = 1.0  # an event wait this much past its timeout is logged as slow
SHUTDOWN_WAIT_S = 1.5  # how long stopping waits for NVML to shut down
START_WAIT_S = 60.0  # NVML's init and discovery at start: a hang ends in a clear error


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
        clock: Callable[[], float] = time.monotonic,
        hang_s: float = HANG_S,
        on_health: Callable[[DeviceHealth], None] | None = None,
    ) -> None:
        self._on_health = on_health  # told of each health change; must not block
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
        self._reasons: dict[str, str | None] = {}
        self._gone: set[str] = set()  # taken off the node: not advertised while away
        self._clock = clock
        self._health = GpuHealth(
            HealthPolicy(config.health.disabled_xids, config.health.xid_recovery_s)
        )
        self._probe_nvml = StatusProbe(nvml, hang_s, clock)
        self._kick = asyncio.Event()  # probe now: the event wait returned early

    def start(self) -> None:
        """Initialise NVML and plan the resources. Raises BackendError or ConfigError."""
        try:
            waited(self._nvml.init, START_WAIT_S, "init")
        except BackendError as exc:
            if self._config.flags.fail_on_init_error:
                raise
            log.warning("gpu_family_disabled", reason=str(exc), setting="failOnInitError=false")
            return
        self.gpus = waited(lambda: discover(self._nvml, self._sysfs), START_WAIT_S, "discovery")
        self._resources = self._build(self.gpus)
        # Every GPU starts Healthy; the first probe, as run() begins, says otherwise.
        self._healthy = {g.uuid: True for g in self.gpus}
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
            return gpu_distance(by_uuid[a], by_uuid[b])

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

    def unhealthy_reason(self, uuid: str) -> str | None:
        """Why the GPU is Unhealthy as last published ("lost", "xid=79", "holding", ...)."""
        return self._reasons.get(uuid)

    def resources(self) -> Sequence[GpuResource]:
        return self._resources

    def device_health(self, gpu: str | None = None) -> list[DeviceHealth]:
        """Every advertised device (of `gpu` alone if given) as the cluster is told of it:
        a replica's GPU once per resource, a MIG instance on its own."""
        states = []
        for resource in self._resources:
            seen: set[str] = set()
            for unit in resource.plan.units:
                if unit.gpu_uuid in self._gone or unit.visible_id in seen:
                    continue
                if gpu is not None and unit.gpu_uuid != gpu:
                    continue
                seen.add(unit.visible_id)
                reason = self._reasons.get(unit.gpu_uuid)
                states.append(
                    DeviceHealth(
                        resource.name, unit.visible_id, _where(unit), reason is None, reason
                    )
                )
        return states

    async def run(self, stop: asyncio.Event) -> None:
        if not self._resources:
            return
        # NVML is only ever awaited here, through threads: a call hung in the driver
        # stalls neither the other GPUs' probes, nor any RPC, nor stopping.
        loops = [asyncio.ensure_future(self._probe()), asyncio.ensure_future(self._events())]
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([*loops, stopped], return_when=asyncio.FIRST_COMPLETED)
            for loop in loops:
                if loop.done():
                    loop.result()  # the loops never end by themselves: raise why one did
        finally:
            stopped.cancel()
            for loop in loops:
                loop.cancel()
            for loop in loops:
                with contextlib.suppress(asyncio.CancelledError):
                    await loop
            self._probe_nvml.close()
            try:
                await bounded(self._nvml.shutdown, SHUTDOWN_WAIT_S, "nvml-shutdown")
            except BackendError as exc:
                log.warning("nvml_shutdown_failed", error=str(exc))

    async def _probe(self) -> None:
        """Ask NVML about every GPU once a second (sooner after an early event wake-up)."""
        while True:
            answers = await self._probe_nvml.statuses([g.uuid for g in self.gpus], PROBE_WAIT_S)
            now = self._clock()
            for uuid, status in answers.items():
                for code in status.xids:
                    self._xid(XidEvent(uuid, code), now)
                self._health.answered(uuid, now, _failing(status), lost=status.lost)
                self._note_gone(uuid, status.gone)
            self._publish(now)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PROBE_INTERVAL_S):  # a timer, not a task
                    await self._kick.wait()
            self._kick.clear()

    async def _events(self) -> None:
        """XID events as NVML delivers them."""
        while True:
            began = self._clock()
            try:
                events = await self._next_events()
            except BackendError as exc:
                log.error("nvml_events_failed", error=str(exc))
                await asyncio.sleep(PROBE_INTERVAL_S)
                continue
            now = self._clock()
            for event in events:
                self._xid(event, now)
            if events or now - began < PROBE_INTERVAL_S / 2:
                self._publish(now)
                self._kick.set()  # something changed: probe now rather than at the tick

    async def _next_events(self) -> list[XidEvent]:
        """One event wait; one that outlives its timeout by far is logged, once."""
        waiting = asyncio.ensure_future(self._nvml.next_events(PROBE_INTERVAL_S))
        try:
            done, _ = await asyncio.wait({waiting}, timeout=PROBE_INTERVAL_S + EVENT_WAIT_SLACK_S)
            if not done:
                log.warning("nvml_event_wait_slow", waited_s=PROBE_INTERVAL_S + EVENT_WAIT_SLACK_S)
            return await waiting
        finally:
            waiting.cancel()

    def _note_gone(self, uuid: str, gone: bool) -> None:
        if gone and uuid not in self._gone:
            log.warning("gpu_removed", gpu=uuid)
            self._gone.add(uuid)
        elif not gone and uuid in self._gone:
            log.info("gpu_back", gpu=uuid)
            self._gone.discard(uuid)

    def _xid(self, event: XidEvent, now: float) -> None:
        if all(g.uuid != event.uuid for g in self.gpus):
            return  # not a GPU this agent serves
        new = self._health.xid(event.uuid, event.xid, now)
        critical = is_critical(event.xid, self._config.health.disabled_xids)
        # The same critical XID again (an ECC count that keeps growing) is no news.
        level = log.info if new or not critical else log.debug
        level("xid_event", gpu=event.uuid, xid=event.xid, critical=critical)

    def _publish(self, now: float) -> None:
        """Push the health to each resource only when it changed.

        This runs on every probe tick: a push rebuilds the device list of every resource
        (GPUs x replicas), which an idle node never needs.
        """
        healthy: dict[str, bool] = {}
        for gpu in self.gpus:
            if gpu.uuid in self._gone:
                continue
            reason = self._health.reason(gpu.uuid, now)
            healthy[gpu.uuid] = reason is None
            self._log_transition(gpu.uuid, reason)
        self._healthy = healthy
        if healthy == self._pushed:
            return
        self._pushed = dict(healthy)
        for resource in self._resources:
            resource.set_health(healthy)

    def _log_transition(self, uuid: str, reason: str | None) -> None:
        before = self._reasons.get(uuid)
        self._reasons[uuid] = reason
        if (before is None) == (reason is None):
            if reason is not None and reason not in (before, "holding"):
                log.warning("device_unhealthy", gpu=uuid, reason=reason)
                self._tell(uuid)
            return
        if reason is None:
            log.info("device_healthy", gpu=uuid)
        else:
            log.warning("device_unhealthy", gpu=uuid, reason=reason)
        self._tell(uuid)
        for resource in self._resources:
            self._telemetry.health_event(resource.name, reason or "recovered")

    def _tell(self, uuid: str) -> None:
        if self._on_health is not None:
            for state in self.device_health(uuid):
                self._on_health(state)


def _where(unit: Unit) -> str:
    """The device as nvidia-smi numbers it: "GPU 3", "MIG 0:1"."""
    kind = "GPU" if unit.visible_id == unit.gpu_uuid else "MIG"
    return f"{kind} {unit.index}" if unit.index else kind


def _failing(status: GpuStatus) -> str | None:
    """Why NVML's answer was not normal, as the health reason; None when it was."""
    if status.lost:
        return "lost"
    if status.hung:
        return "hung"
    if status.error is not None:
        return f"nvml: {status.error}"
    return None
