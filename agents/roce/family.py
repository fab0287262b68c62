"""The RoCE family: discovers NICs and keeps their health from link and RDMA port state.

Link changes are pushed by the kernel (netlink) and wake the loop at once; the RDMA
port state in sysfs is a second signal, read on every wake and once per PORT_POLL_S.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from agents.config import Config
from agents.core.debounce import Debouncer
from agents.core.ledger import PairingSide
from agents.core.node_report import DeviceHealth
from agents.hw.netlink import LinkMonitor, LinkState
from agents.hw.sysfs import Sysfs
from agents.plugin.telemetry import NoTelemetry, Telemetry
from agents.roce.discovery import Nic, discover
from agents.roce.resource import RoceResource

log = structlog.get_logger(__name__)

# A RoCE port's state follows its netdev's carrier, whose changes netlink pushes at once:
# the poll is a backstop, and reading every NIC's port file each second cost a third of
# an idle agent's CPU time.
PORT_POLL_S = 5.0
FLAP_HOLD_S = 2.0  # after a reported change, later flaps of that NIC wait this long
ACTIVE = "ACTIVE"


class RoceFamily:
    name = "roce"

    def __init__(
        self,
        sysfs: Sysfs,
        links: LinkMonitor,
        config: Config,
        *,
        dev_root: Path | None = None,
        telemetry: Telemetry | None = None,
        clock: Callable[[], float] = time.monotonic,
        pairing: PairingSide | None = None,
        on_health: Callable[[DeviceHealth], None] | None = None,
    ) -> None:
        self._on_health = on_health  # told of each health change; must not block
        self._reasons: dict[str, str] = {}  # why each Unhealthy NIC turned so
        self._sysfs = sysfs
        self._links = links
        self._selectors = config.roce.selectors
        self._telemetry = telemetry or NoTelemetry()
        self._clock = clock
        self._health: Debouncer[str, bool] = Debouncer(FLAP_HOLD_S)
        self._resource = RoceResource(
            config.roce.resource_name,
            [],
            dev_root="" if dev_root is None else str(dev_root),
            pairing=pairing,
        )
        self._nics: list[Nic] = []
        self._pushed: tuple[list[Nic], dict[str, bool]] | None = None  # last set_nics

    def start(self) -> None:
        self._nics = discover(self._sysfs, self._selectors)
        self._refresh()
        log.info("nics_discovered", count=len(self._nics), nics=[n.pci for n in self._nics])

    def resources(self) -> Sequence[RoceResource]:
        return [self._resource]

    @property
    def nics(self) -> list[Nic]:
        return self._nics

    async def run(self, stop: asyncio.Event) -> None:
        stopped = asyncio.ensure_future(stop.wait())  # one waiter for all polls
        try:
            while not stop.is_set():
                changed = await self._wait(stopped)
                if changed:
                    self._nics = discover(self._sysfs, self._selectors)
                self._refresh()
        finally:
            stopped.cancel()
            self._links.close()

    async def _wait(self, stopped: asyncio.Future[Any]) -> bool:
        due = self._health.next_due()
        timeout = PORT_POLL_S if due is None else max(0.0, min(PORT_POLL_S, due - self._clock()))
        change = asyncio.ensure_future(self._links.next_change(timeout))
        try:
            await asyncio.wait([change, stopped], return_when=asyncio.FIRST_COMPLETED)
            return change.done() and change.result()
        finally:
            change.cancel()

    def _state(self, nic: Nic) -> tuple[bool, str]:
        link = self._links.state(nic.netdev)
        if link is not LinkState.UP:
            return False, f"link_{link.value}"
        port = self._sysfs.port_state(nic.rdma, nic.port)
        if port != ACTIVE:
            return False, f"port_{(port or 'absent').lower()}"
        return True, "up"

    def _refresh(self) -> None:
        now = self._clock()
        before = {n.pci: self._health.value(n.pci) for n in self._nics}
        reasons = {}
        for nic in self._nics:
            ok, reasons[nic.pci] = self._state(nic)
            self._health.observe(nic.pci, ok, now)
        self._health.flush_due(now)
        healthy = {n.pci: bool(self._health.value(n.pci)) for n in self._nics}
        for nic in self._nics:
            if not healthy[nic.pci] and (
                before[nic.pci] is not False or nic.pci not in self._reasons
            ):
                self._reasons[nic.pci] = reasons[nic.pci]
            if before[nic.pci] is not None and before[nic.pci] != healthy[nic.pci]:
                self._report(nic, healthy[nic.pci], reasons[nic.pci])
        # Most polls change nothing: rebuilding the device list then is wasted work.
        if self._pushed != (self._nics, healthy):
            self._pushed = (self._nics, healthy)
            self._resource.set_nics(self._nics, healthy)

    def _report(self, nic: Nic, ok: bool, reason: str) -> None:
        if ok:
            log.info("device_healthy", nic=nic.pci, netdev=nic.netdev)
        else:
            log.warning("device_unhealthy", nic=nic.pci, netdev=nic.netdev, reason=reason)
        self._telemetry.health_event(self._resource.name, "recovered" if ok else reason)
        if self._on_health is not None:
            self._on_health(self._state_of(nic, ok))

    def device_health(self) -> list[DeviceHealth]:
        """Every advertised NIC as the cluster is told of it."""
        healthy = {d.id: d.healthy for d in self._resource.inventory.devices}
        return [self._state_of(n, healthy[n.pci]) for n in self._nics if n.pci in healthy]

    def _state_of(self, nic: Nic, ok: bool) -> DeviceHealth:
        reason = None if ok else self._reasons.get(nic.pci, "link_down")
        where = f"interface {nic.netdev}"
        return DeviceHealth(self._resource.name, nic.pci, where, ok, reason)
