"""The GPU family: GPU resources built from one discovery, their health kept current."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import structlog

from agents.config import Config
from agents.core.gpu_signals import GpuReading
from agents.core.health import Cause, DeviceHealth, GpuLost, Grade, NvmlError, NvmlHung
from agents.core.ledger import PairingSide
from agents.core.readings import gpu_readings
from agents.core.topology import Distance, PciLocation
from agents.core.xid import GpuHealth, HealthPolicy, is_critical
from agents.errors import BackendError
from agents.family import Family, HealthSink, Located
from agents.gpu import dra, mps
from agents.gpu.discovery import gpu_distance, nvlink_counts
from agents.gpu.found import GpusFound
from agents.gpu.gfd import GfdLabels
from agents.gpu.mps_retire import MpsRetirement, retire
from agents.gpu.plan import Unit
from agents.gpu.resource import AllocateOptions, GpuResource, whole_gpus
from agents.gpu.share_mps import hold_shares
from agents.gpu.shares import share_edits, unlimited
from agents.gpu.signals import GpuSignalWatch
from agents.hw.nvml import GpuStatus, GpuTouches, Nvml, XidEvent
from agents.hw.nvml_calls import StatusProbe, bounded
from agents.kernel.edits import Consumed, ContainerEdits, DeviceKey, by_resource, merged
from agents.kernel.facts import FamilyFacts
from agents.labels import label_value
from agents.timing import PRODUCTION, Timing

log = structlog.get_logger(__name__)

PROBE_WAIT_S = 0.5  # how long one probe waits for NVML's answers before it moves on
EARLY_S = 0.05  # an event wait that ends this much before its timeout was woken: news
EVENT_WAIT_SLACK_S = 1.0  # an event wait this much past its timeout is logged as slow
SHUTDOWN_WAIT_S = 1.5  # how long stopping waits for NVML to shut down
# On a node whose GPUs are all Healthy and all answered the event thread's touches within
# the last probe period, NVML's full probe (every GPU's status and ECC count, through a
# worker thread) runs on one tick in this many; any news makes the next tick a full one.
QUIET_PROBES = 5


class GpuFamily:
    name = "gpu"

    def __init__(
        self,
        nvml: Nvml,
        found: GpusFound,
        config: Config,
        *,
        health: HealthSink | None = None,
        pairing: PairingSide | None = None,
        clock: Callable[[], float] = time.monotonic,
        timing: Timing = PRODUCTION,
    ) -> None:
        self._nvml = nvml
        self._held = found.held  # an NVML initialisation to give back
        self._driver = found.driver
        self._sink = health  # told of each evaluation; must not block
        self._config = config
        self.gpus = list(found.gpus)
        self._resources, self._located = self._build(found, pairing)
        # Every GPU starts Healthy; the first probe, as run() begins, says otherwise.
        self._healthy: dict[str, bool] = {g.uuid: True for g in self.gpus}
        self._pushed: dict[str, Grade] | None = None  # what the resources were last given
        self._all_healthy = False  # at the last publish: every GPU present and Healthy
        self._causes: dict[str, Cause | None] = {}
        self._told: dict[str, Cause | None] | None = None  # the causes last published
        self._gone: set[str] = set()  # taken off the node: not advertised while away
        self._clock = clock
        self._health = GpuHealth(
            HealthPolicy(
                config.health.disabled_xids, config.health.xid_recovery_s, timing.gpu_hold_s
            )
        )
        self._probe_s = timing.gpu_probe_s
        self._event_wait_s = timing.gpu_event_wait_s
        self._probe_nvml = StatusProbe(nvml, timing.gpu_hang_s, clock)
        self._signal_s = timing.signal_probe_s
        self._signals = GpuSignalWatch(
            nvml,
            [g.uuid for g in self.gpus],
            config.health.degraded.limits,
            clock,
        )
        self._lost: set[str] = set()  # lost at the last probe: judged afresh when back
        self._gfd = GfdLabels(config, found.driver, found.machine, found.vgpus)
        self._fabrics = dict(found.fabrics)  # GPU UUID -> its NVLink fabric, kept current
        # Read again by each signal round: those that had a fabric at discovery.
        self._fabric_gpus = frozenset(u for u, f in found.fabrics.items() if f is not None)
        self._kick = asyncio.Event()  # probe now: the event wait returned early
        self._mps = found.mps
        self._share_mps = found.share_mps  # None: shares' limits not enforced by MPS
        self._retiring = MpsRetirement(None, nvml, (), self._mps_gpus)  # after a reload
        self._unlimited = unlimited(found.gpus)  # GPUs whose shares MPS cannot limit
        self._dev_root = found.dev_root
        self._mps_restart_s = timing.mps_restart_s

    def _build(
        self, found: GpusFound, pairing: PairingSide | None
    ) -> tuple[list[GpuResource], Located]:
        """The resources of the plans; the whole-GPU resource is paired when it is the
        only one."""
        gpus = found.gpus
        options = AllocateOptions(
            flags=self._config.flags,
            fail_requests_greater_than_one=(
                self._config.sharing.replicated.fail_requests_greater_than_one
            ),
            minors={g.uuid: g.minor for g in gpus},
            mig_caps=found.mig_caps,
            dev_root=found.dev_root,
            imex_channels=found.imex_channels,
            mps_root=self._config.flags.mps_root,
        )
        nvlinks = nvlink_counts(gpus)
        by_uuid = {g.uuid: g for g in gpus}

        def pcie(a: str, b: str) -> Distance:
            return gpu_distance(by_uuid[a], by_uuid[b])

        whole = [p for p in found.plans if whole_gpus(p)]
        paired = whole[0] if len(whole) == 1 and pairing is not None else None
        located = Located("", {})  # nothing paired without one whole-GPU resource
        if paired is not None:
            located = Located(
                paired.name, {u.id: by_uuid[u.gpu_uuid].location for u in paired.units}
            )
        resources = [
            GpuResource(
                plan,
                options,
                nvlinks=nvlinks,
                pcie=pcie,
                pairing=pairing if plan is paired else None,
                degraded_unhealthy=self._config.health.degraded.report == "unhealthy",
            )
            for plan in found.plans
        ]
        return resources, located

    def located(self) -> Located:
        return self._located

    def locations(self) -> dict[str, PciLocation]:
        return {g.uuid: g.location for g in self.gpus if g.location is not None}

    def labels(self) -> dict[str, str]:
        labels = {"gpu.count": str(len(self.gpus)), "gpu.healthy": str(self.healthy_count())}
        if self.gpus:
            labels["gpu.product"] = label_value(self.gpus[0].model)
            labels["gpu.memory"] = str(self.gpus[0].memory_mib)
            mig = any(g.mig_enabled or g.mig for g in self.gpus)
            labels["gpu.mig.capable"] = str(mig).lower()
        # GFD counts the GPUs NVML answers for: not one lost or taken off the node.
        present = [g for g in self.gpus if g.uuid not in self._gone | self._lost]
        return labels | self._gfd.labels(present, self._fabrics)

    def healthy_count(self) -> int:
        """Physical GPUs that are present and healthy."""
        return sum(1 for ok in self._healthy.values() if ok)

    def unhealthy_cause(self, uuid: str) -> Cause | None:
        """Why the GPU is Unhealthy as last published (lost, XIDs, holding, ...)."""
        return self._causes.get(uuid)

    def resources(self) -> Sequence[GpuResource]:
        return self._resources

    def device_health(self) -> list[DeviceHealth]:
        """Every advertised device as the cluster is told of it: a replica's GPU once per
        resource, a MIG instance on its own."""
        states = []
        for resource in self._resources:
            seen: set[str] = set()
            for unit in resource.plan.units:
                if unit.gpu_uuid in self._gone or unit.visible_id in seen:
                    continue
                seen.add(unit.visible_id)
                cause = self._causes.get(unit.gpu_uuid)
                states.append(DeviceHealth(resource.name, unit.visible_id, _where(unit), cause))
        return states

    def facts(self) -> FamilyFacts:
        """Each served whole GPU and MIG instance (not one taken off the node), under the
        resource that serves it."""
        served = [
            (r.name, u)
            for r in self._resources
            for u in r.plan.units
            if u.gpu_uuid not in self._gone
        ]
        shares = self._config.sharing.served_shares
        found = dra.devices(self.gpus, served, self._driver, self._fabrics, shares)
        held = None if self._share_mps is None else self._hold_shares
        return FamilyFacts(dra.DRIVER, found, accepts=dra.accepts, shares_held=held)

    async def _hold_shares(self, held: frozenset[DeviceKey], fresh: frozenset[DeviceKey]) -> None:
        """The GPUs of the devices that hold shares told to their MPS daemon's keeper."""
        assert self._share_mps is not None
        gpus = {(r.name, u.id): u.gpu_uuid for r in self._resources for u in r.plan.units}
        daemon = self._share_mps
        if not daemon.down and frozenset(gpus[k] for k in held if k in gpus) == daemon.holding:
            return  # a share joining shares of its GPUs, the daemon up: nothing to change
        try:
            await hold_shares(self._share_mps, gpus, held, fresh)
        finally:
            self._publish(self._clock())  # a GPU that holds shares is Unhealthy without them

    def edits(
        self, devices: Sequence[DeviceKey], consumed: Consumed | None = None
    ) -> ContainerEdits:
        """What a container gets for these devices; for shares (`consumed`), with the
        GPUs in PCI bus order and the limits MPS holds them to."""
        by_name = {r.name: r for r in self._resources}
        if consumed:
            bus = {g.uuid: g.pci for g in self.gpus}
            devices = sorted(devices, key=lambda key: bus.get(key[1], key[1]))
        base = merged([by_name[r].edits(ids) for r, ids in by_resource(devices).items()])
        if not consumed:
            return base
        shares = self._config.sharing.served_shares
        # a claim with a GPU older than Volta is told no limit: MPS would hold it to none
        enforced = self._share_mps is not None and not self._unlimited.intersection(
            uuid for _, uuid in devices
        )
        mps = (shares, self._dev_root) if shares is not None and enforced else None
        return share_edits(base, devices, consumed, mps)

    def follow(self, earlier: Family) -> None:
        if not isinstance(earlier, GpuFamily):
            return
        self._health.take_over(earlier._health)
        self._gone = set(earlier._gone)
        self._told = earlier._told
        self._lost = set(earlier._lost)
        if self._share_mps is not None and earlier._share_mps is not None:
            self._share_mps.holding = earlier._share_mps.holding
        if earlier._mps is not None:  # daemons this config no longer runs: stopped when idle
            retired = [*earlier._retiring.daemons, *earlier._mps.retired_by(self._mps)]
            self._retiring = MpsRetirement(
                earlier._mps.control, self._nvml, retired, self._mps_gpus
            )
        self._signals.take_over(earlier._signals, self._config.health.degraded.limits)
        self._publish(self._clock())

    async def run(self) -> None:
        """Probe and wait for events until cancelled; then give NVML back."""
        # NVML is only ever awaited here, through threads: a call hung in the driver
        # stalls neither the other GPUs' probes, nor any RPC, nor stopping.
        try:
            if self._resources:
                async with asyncio.TaskGroup() as loops:
                    loops.create_task(self._probe())
                    loops.create_task(self._events())
                    if self._signals.active:
                        loops.create_task(self._read_signals())
                    changed = lambda: self._publish(self._clock())  # noqa: E731
                    if self._retiring.daemons:
                        loops.create_task(retire(self._retiring, self._probe_s))
                    for daemons in (self._mps, self._share_mps):
                        if daemons is not None:
                            loops.create_task(
                                mps.watch(
                                    daemons,
                                    self._probe_s,
                                    self._mps_restart_s,
                                    self._clock,
                                    changed,
                                )
                            )
        finally:
            await self.close()

    def _mps_gpus(self) -> frozenset[str]:
        """The GPUs that MPS serves under this config: its daemons', those holding shares."""
        served = frozenset() if self._mps is None else self._mps.gpus()
        return served | (self._share_mps.holding if self._share_mps is not None else frozenset())

    async def close(self) -> None:
        """Give back the NVML initialisation of the discovery; safe to call twice."""
        self._probe_nvml.close()
        self._signals.close()
        if not self._held:
            return
        self._held = False
        try:
            await bounded(self._nvml.shutdown, SHUTDOWN_WAIT_S, "nvml-shutdown")
        except BackendError as exc:
            log.warning("nvml_shutdown_failed", error=str(exc))

    async def _probe(self) -> None:
        """Ask NVML about every GPU once a second (sooner after an early event wake-up);
        on a quiet node, where the event thread's touches already say every GPU answers,
        one second in QUIET_PROBES."""
        quiet = 0  # ticks in a row that relied on the touches
        while True:
            if self._all_healthy and quiet < QUIET_PROBES - 1 and self._touched():
                quiet += 1
            else:
                quiet = 0
                uuids = [g.uuid for g in self.gpus]
                answers = await self._probe_nvml.statuses(uuids, PROBE_WAIT_S)
                if not (self._all_healthy and all(s == _ANSWERED for s in answers.values())):
                    self._judge(answers)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._probe_s):  # a timer, not a task
                    await self._kick.wait()
            if self._kick.is_set():
                quiet = QUIET_PROBES  # news: the next tick probes in full
            self._kick.clear()

    def _touched(self) -> bool:
        """Every GPU answered the event thread's touches within the last probe period."""
        nvml = self._nvml
        at = nvml.answered_at() if isinstance(nvml, GpuTouches) else None
        return at is not None and time.monotonic() - at <= self._probe_s

    def _judge(self, answers: Mapping[str, GpuStatus]) -> None:
        """Take a probe's answers. A probe where every GPU answers normally while every GPU
        was Healthy at the last publish changes nothing and is not judged: that is every
        probe of an idle node, once a second."""
        now = self._clock()
        for uuid, status in answers.items():
            for code in status.xids:
                self._xid(XidEvent(uuid, code), now)
            self._health.answered(uuid, now, _failing(status))
            self._note_gone(uuid, status.gone)
            self._note_lost(uuid, status.lost)
        self._publish(now)

    async def _read_signals(self) -> None:
        """Read every present GPU's degraded-device signals once a signal period."""
        while True:
            began = self._clock()
            present = [g.uuid for g in self.gpus if g.uuid not in self._gone]
            readings = await self._signals.read(present, self._signal_s)
            self._gauge(readings)
            self._fabrics_read(readings)
            self._publish(self._clock())
            await asyncio.sleep(max(0.0, self._signal_s - (self._clock() - began)))

    def _fabrics_read(self, readings: Mapping[str, GpuReading]) -> None:
        """The fabrics of a signal round, for GPUs that had one at discovery, their health
        aside (that is the nvlink-fabric signal, and changes no label): where one changed
        (it registered late, or went), labels and DRA attributes say so, device lists stay."""
        fresh = {
            uuid: None if r.fabric is None else replace(r.fabric, health_mask=0)
            for uuid, r in readings.items()
            if uuid in self._fabric_gpus
        }
        if all(self._fabrics.get(uuid) == fabric for uuid, fabric in fresh.items()):
            return
        self._fabrics = self._fabrics | fresh
        for resource in self._resources:
            resource.inventory.touch()

    def _gauge(self, readings: Mapping[str, GpuReading]) -> None:
        """A round's readings, to the always-on gauges: each GPU's under every resource
        that serves it, labelled with the GPU's UUID."""
        if self._sink is None:
            return
        for resource in self._resources:
            for uuid in dict.fromkeys(u.gpu_uuid for u in resource.plan.units):
                if uuid in readings:
                    self._sink.readings(resource.name, uuid, gpu_readings(readings[uuid]))

    async def _events(self) -> None:
        """XID events as NVML delivers them."""
        while True:
            began = self._clock()
            try:
                events = await self._next_events()
            except BackendError as exc:
                log.error("nvml_events_failed", error=str(exc))
                await asyncio.sleep(self._probe_s)
                continue
            now = self._clock()
            for event in events:
                self._xid(event, now)
            if events or now - began < self._event_wait_s - EARLY_S:  # woken before its time
                self._publish(now)
                self._kick.set()  # something changed: probe now rather than at the tick

    async def _next_events(self) -> list[XidEvent]:
        """One event wait; one that outlives its timeout by far is logged, once."""
        waiting = asyncio.ensure_future(self._nvml.next_events(self._event_wait_s))
        try:
            async with asyncio.timeout(self._event_wait_s + EVENT_WAIT_SLACK_S):
                return await asyncio.shield(waiting)
        except TimeoutError:
            log.warning("nvml_event_wait_slow", waited_s=self._event_wait_s + EVENT_WAIT_SLACK_S)
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

    def _note_lost(self, uuid: str, lost: bool) -> None:
        if lost:
            self._lost.add(uuid)
        elif uuid in self._lost:
            self._lost.discard(uuid)
            self._signals.reset(uuid)

    def _xid(self, event: XidEvent, now: float) -> None:
        if all(g.uuid != event.uuid for g in self.gpus):
            return  # not a GPU this agent serves
        self._count_xid(event)
        new = self._health.xid(event.uuid, event.xid, now)
        critical = is_critical(event.xid, self._config.health.disabled_xids)
        # The same critical XID again (an ECC count that keeps growing) is no news.
        level = log.info if new or not critical else log.debug
        fields = {"gpu": event.uuid, "xid": event.xid, "critical": critical}
        level("xid_event", **fields)

    def _count_xid(self, event: XidEvent) -> None:
        """Every XID to the metrics, under each resource that serves its GPU."""
        if self._sink is None:
            return
        for resource in self._resources:
            if any(u.gpu_uuid == event.uuid for u in resource.plan.units):
                self._sink.xid(resource.name, event.uuid, event.xid)

    def _mps_cause(self, uuid: str) -> Cause | None:
        cause = None if self._mps is None else self._mps.cause(uuid)
        return cause or (None if self._share_mps is None else self._share_mps.cause(uuid))

    def _publish(self, now: float) -> None:
        """Evaluate every GPU's health; push it to the resources only when it changed.

        This runs on every probe tick: a push rebuilds the device list of every resource
        (GPUs x replicas), which an idle node never needs.
        """
        grades: dict[str, Grade] = {}
        for gpu in self.gpus:
            if gpu.uuid in self._gone:
                continue
            # Unhealthy for an XID, lost, ...: that wins over any signal.
            cause = self._health.cause(gpu.uuid, now) or self._mps_cause(gpu.uuid)
            cause = cause or self._signals.cause(gpu.uuid)
            grades[gpu.uuid] = Grade.HEALTHY if cause is None else cause.grade
            self._causes[gpu.uuid] = cause
        self._healthy = {u: g is not Grade.UNHEALTHY for u, g in grades.items()}
        self._all_healthy = not self._gone and all(c is None for c in self._causes.values())
        if grades == self._pushed and self._causes == self._told:
            return
        self._told = dict(self._causes)
        if grades != self._pushed:
            self._pushed = dict(grades)
            for resource in self._resources:
                resource.set_health(grades)
        else:  # only a cause changed (lost, then holding): DRA shows it, the kubelet cannot
            for resource in self._resources:
                resource.inventory.touch()
        if self._sink is not None:
            self._sink.publish(self.device_health())


def _where(unit: Unit) -> str:
    """The device as nvidia-smi numbers it: "GPU 3", "MIG 0:1"."""
    kind = "GPU" if unit.visible_id == unit.gpu_uuid else "MIG"
    return f"{kind} {unit.index}" if unit.index else kind


_ANSWERED = GpuStatus(lost=False)  # a GPU that answered normally, and nothing more


def _failing(status: GpuStatus) -> Cause | None:
    """Why NVML's answer was not normal; None when it was."""
    if status.lost:
        return GpuLost()
    if status.hung:
        return NvmlHung()
    if status.error is not None:
        return NvmlError(status.error)
    return None
