"""The RoCE family: NICs from one discovery, their health kept from link and RDMA port
state and their degraded-device signals, and the NIC list kept current as functions come
and go.

Link changes are pushed by the kernel (netlink) and wake the loop at once; the RDMA
port state in sysfs is a second signal, read on every wake and once per port poll
(agents.timing). The degraded-device signals (agents.roce.signals) are read on a period
of their own; LLDP neighbours are followed beside them, woken only by the neighbour source.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from agents.config import Config
from agents.core.debounce import Debouncer
from agents.core.health import Cause, DeviceHealth, Grade, LinkNotUp, PortNotActive
from agents.core.ledger import PairingSide
from agents.core.topology import PciLocation
from agents.family import Family, HealthSink, Located
from agents.hw.lldp import NeighbourSource
from agents.hw.netlink import LinkMonitor, LinkState
from agents.hw.sysfs import Sysfs
from agents.kernel.edits import Consumed, ContainerEdits, DeviceKey, by_resource, merged
from agents.kernel.facts import FamilyFacts
from agents.roce import dra
from agents.roce.discovery import Nic, discover
from agents.roce.fabric_watch import UNKNOWN_AFTER_S, FabricWatch
from agents.roce.resource import RoceResource
from agents.roce.signals import NicProbe, NicSignalWatch, Round, read_signals
from agents.timing import PRODUCTION, Timing

log = structlog.get_logger(__name__)

ACTIVE = "ACTIVE"


@dataclass(frozen=True)
class NicsFound:
    """What one discovery found: the NICs, their RDMA port states and their degraded-device
    signals (so that a NIC found Degraded is never advertised as Healthy first)."""

    nics: tuple[Nic, ...]
    ports: dict[str, str | None]  # PCI address -> port state
    signals: Mapping[str, NicProbe] = field(default_factory=dict)  # PCI address -> probe


def discover_nics(sysfs: Sysfs, config: Config) -> NicsFound:
    """Blocking (sysfs)."""
    nics = discover(sysfs, config.roce.selectors)
    return NicsFound(tuple(nics), port_states(sysfs, nics), read_signals(sysfs, nics))


def port_states(sysfs: Sysfs, nics: Sequence[Nic]) -> dict[str, str | None]:
    """Blocking (sysfs): each NIC's RDMA port state."""
    return {nic.pci: sysfs.port_state(nic.rdma, nic.port) for nic in nics}


class RoceFamily:
    name = "roce"

    def __init__(
        self,
        sysfs: Sysfs,
        links: LinkMonitor,
        found: NicsFound,
        config: Config,
        *,
        dev_root: str = "",
        health: HealthSink | None = None,
        pairing: PairingSide | None = None,
        lldp: NeighbourSource | None = None,
        clock: Callable[[], float] = time.monotonic,
        unknown_after_s: float = UNKNOWN_AFTER_S,
        timing: Timing = PRODUCTION,
    ) -> None:
        self._sink = health  # told of each evaluation; must not block
        self._causes: dict[str, Cause] = {}  # why each Unhealthy NIC turned so
        self._sysfs = sysfs
        self._links = links  # the agent's: it closes them
        self._selectors = config.roce.selectors
        self._clock = clock
        self._health: Debouncer[str, bool] = Debouncer(timing.nic_flap_hold_s)
        self._port_poll_s = timing.nic_port_poll_s
        self._signal_s = timing.signal_probe_s
        self._nics = list(found.nics)
        self._resource = RoceResource(
            config.roce.resource_name,
            self._nics,
            dev_root=dev_root,
            pairing=pairing,
            degraded_unhealthy=config.health.degraded.report == "unhealthy",
        )
        self._up: dict[str, bool] = {}  # by link and port, as last debounced
        self._pushed: tuple[list[Nic], dict[str, Grade]] | None = None  # last handed over
        self._ports = found.ports  # as discovered: the state until the first wake
        self._signals = NicSignalWatch(sysfs, config.health.degraded.limits, clock=clock)
        self._signals.watch(self._nics)
        self._first = self._signals.judge(found.signals, self._link_up)  # its readings: run()
        # The source is the agent's; `fabric_unknown` after unknown_after_s without a word.
        self.fabric = FabricWatch(lldp, config.fabric, clock=clock, unknown_after_s=unknown_after_s)
        self._apply(self._nics, self._ports)
        log.info("nics_discovered", count=len(self._nics), nics=[n.pci for n in self._nics])

    def resources(self) -> Sequence[RoceResource]:
        return [self._resource]

    @property
    def nics(self) -> list[Nic]:
        return self._nics

    def located(self) -> Located:
        return Located(self._resource.name, {n.pci: n.location for n in self._nics})

    def locations(self) -> dict[str, PciLocation]:
        return {n.pci: n.location for n in self._nics if n.location is not None}

    def labels(self) -> dict[str, str]:
        healthy = sum(1 for d in self._resource.inventory.devices if d.healthy)
        own = {"roce.count": str(len(self._nics)), "roce.healthy": str(healthy)}
        return own | self.fabric.labels()  # the fabric's keys carry their own prefixes

    def facts(self) -> FamilyFacts:
        devices = dra.devices(self._nics, self._resource.name, self.fabric.neighbours)
        return FamilyFacts(dra.DRIVER, devices)

    def edits(
        self, devices: Sequence[DeviceKey], consumed: Consumed | None = None
    ) -> ContainerEdits:
        by_name = {r.name: r for r in self.resources()}
        return merged([by_name[r].edits(ids) for r, ids in by_resource(devices).items()])

    async def run(self) -> None:
        """Keep health, the NIC list and their neighbours current until cancelled."""
        self._publish()  # the state found at discovery, NICs already down included
        self._signals.tell()
        self._gauge(self._first)
        self._watch_fabric()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.fabric.run(self._fabric_changed))
                group.create_task(self._follow_signals())
                await self._follow_links()
        finally:
            self._signals.close()

    async def _follow_links(self) -> None:
        while True:
            changed = await self._links.next_change(self._timeout())
            nics = self._nics
            if changed:
                nics = await asyncio.to_thread(discover, self._sysfs, self._selectors)
            ports = await asyncio.to_thread(port_states, self._sysfs, nics)
            if self._apply(nics, ports):
                self._publish()
                self._watch_fabric()

    async def _follow_signals(self) -> None:
        """Every NIC's degraded-device signals, read each probe period (the first were
        read at discovery); a change of a NIC's grade or cause is published."""
        while True:
            await asyncio.sleep(self._signal_s)  # the probe period, not a wait for a state
            done = await self._signals.probe(self._signal_s, self._link_up)
            self._signals.tell()
            self._gauge(done)
            if self._push():
                self._publish()
            elif done.causes:  # the same grades; new figures, or other signals
                if done.signals:  # what DRA's taints and attributes name changed
                    self._resource.inventory.touch()
                self._publish()

    def _gauge(self, done: Round) -> None:
        """A round's readings, to the always-on gauges."""
        if self._sink is not None:
            for pci, values in done.readings.items():
                self._sink.readings(self._resource.name, pci, values)

    def follow(self, earlier: Family) -> None:
        if not isinstance(earlier, RoceFamily):
            return
        self._health, self._causes = earlier._health, earlier._causes
        self._signals.follow(earlier._signals)
        self.fabric.follow(earlier.fabric)
        self._apply(self._nics, self._ports)

    async def close(self) -> None:
        """Let the signal reader go; the links are the agent's."""
        self._signals.close()

    def _watch_fabric(self) -> None:
        """Listen on the current NICs' netdevs; a change of what they hear is told."""
        if self.fabric.watch(n.netdev for n in self._nics):
            self._fabric_changed()

    def _fabric_changed(self) -> None:
        """Slices and labels read the neighbours again; the kubelet's list is unchanged."""
        place = self.fabric.place()
        log.info(
            "fabric_neighbours",
            leaves={i: n.leaf for i, n in sorted(self.fabric.neighbours.items())},
            leaf_group=place.leaf_group if place else None,
            spine=place.spine if place else None,
        )
        self._resource.inventory.touch()

    def _timeout(self) -> float:
        due = self._health.next_due()
        poll = self._port_poll_s
        return poll if due is None else max(0.0, min(poll, due - self._clock()))

    def _state(self, nic: Nic, port: str | None) -> Cause | None:
        """Why the NIC is not up now; None when it is."""
        link = self._links.state(nic.netdev)
        if link is not LinkState.UP:
            return LinkNotUp(link.value)
        if port != ACTIVE:
            return PortNotActive((port or "absent").lower())
        return None

    def _apply(self, nics: list[Nic], ports: Mapping[str, str | None]) -> bool:
        """Take in the NICs and their port states; True when the advertised list or its
        health changed."""
        now = self._clock()
        before = {n.pci: self._health.value(n.pci) for n in nics}
        states = {n.pci: self._state(n, ports.get(n.pci)) for n in nics}
        for nic in nics:
            self._health.observe(nic.pci, states[nic.pci] is None, now)
        self._health.flush_due(now)
        healthy = {n.pci: bool(self._health.value(n.pci)) for n in nics}
        for nic in nics:
            cause, turned = states[nic.pci], before[nic.pci] is not False
            if (
                cause is not None
                and not healthy[nic.pci]
                and (turned or nic.pci not in self._causes)
            ):
                self._causes[nic.pci] = cause
        self._up = healthy
        if nics != self._nics:
            self._nics = nics
            self._signals.watch(nics)
            pairing = self._resource.pairing
            if pairing is not None:
                located = self.located()
                pairing.located(located.resource, located.devices)
        return self._push()

    def _push(self) -> bool:
        """Hand the resource each NIC's grade; True when the list or a grade changed."""
        grades = {n.pci: self._grade(n.pci) for n in self._nics}
        # Most polls change nothing: rebuilding the device list then is wasted work.
        if self._pushed == (self._nics, grades):
            return False
        if self._pushed is None or self._pushed[0] != self._nics:
            up = {pci: grade is not Grade.UNHEALTHY for pci, grade in grades.items()}
            self._resource.set_nics(self._nics, up)
        self._pushed = (self._nics, grades)
        self._resource.set_health(grades)  # no await since set_nics: one change to send
        return True

    def _grade(self, pci: str) -> Grade:
        """Unhealthy while the link or port is not up; else as the signals say."""
        cause = self._cause(pci)
        return Grade.HEALTHY if cause is None else cause.grade

    def _cause(self, pci: str) -> Cause | None:
        if not self._up.get(pci, False):
            return self._causes.get(pci, LinkNotUp("down"))
        return self._signals.cause(pci)

    def _link_up(self, nic: Nic) -> bool:
        return self._links.state(nic.netdev) is LinkState.UP

    def _publish(self) -> None:
        if self._sink is not None:
            self._sink.publish(self.device_health())

    def device_health(self) -> list[DeviceHealth]:
        """Every advertised NIC as the cluster is told of it."""
        listed = self._resource.inventory.ids()
        return [self._state_of(n) for n in self._nics if n.pci in listed]

    def _state_of(self, nic: Nic) -> DeviceHealth:
        where = f"interface {nic.netdev}"
        return DeviceHealth(self._resource.name, nic.pci, where, self._cause(nic.pci))
