"""The degraded-device signals of the RoCE NICs (docs/degraded.md): each NIC's sysfs files
read off the event loop, judged against the configured limits, and the verdict kept as
the cause the cluster is told of."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import structlog

from agents.core.degraded import Clock, DeviceVerdict, Limits, Unknown
from agents.core.health import Grade, Signal
from agents.core.nic_signals import NicReading, NicSignals, expected_speeds
from agents.errors import BackendError
from agents.hw.signal_probes import SignalProbes
from agents.hw.sysfs import Sysfs
from agents.roce.discovery import Nic

log = structlog.get_logger(__name__)

_GRADES = {"degraded": Grade.DEGRADED, "unhealthy": Grade.UNHEALTHY}


@dataclass(frozen=True)
class NicProbe:
    """One reading of one NIC's signal files, with its PCI model (`vendor:device`), which
    picks the speed it is expected to run at."""

    model: str
    reading: NicReading


def read_signals(sysfs: Sysfs, nics: Iterable[Nic]) -> dict[str, NicProbe]:
    """Blocking (sysfs): every NIC's probe, by PCI address."""
    return {n.pci: _probe(sysfs, n, None) for n in nics}


def _probe(sysfs: Sysfs, nic: Nic, model: str | None) -> NicProbe:
    """Blocking. The model is read once per NIC: it does not change."""
    reading = sysfs.nic_reading(nic.netdev, nic.rdma, nic.port)
    return NicProbe(sysfs.pci_model(nic.pci) if model is None else model, reading)


@dataclass(frozen=True)
class _Kept:
    """A NIC's cause, and the signals it stands for: renewed only when they change, so
    that a counter that keeps climbing is one fault, not a new one at every probe."""

    signals: frozenset[str]
    cause: Signal


class NicSignalWatch:
    """The signals of the watched NICs, each judged by its own NicSignals (by PCI address,
    named by its interface). Used on the event loop; only the reads run in a worker."""

    def __init__(self, sysfs: Sysfs, limits: Limits, *, clock: Clock) -> None:
        self._sysfs = sysfs
        self._limits = limits
        self._clock = clock
        self._nics: dict[str, Nic] = {}  # replaced whole: the worker reads it
        self._models: dict[str, str] = {}
        self._signals: dict[str, NicSignals] = {}
        self._kept: dict[str, _Kept] = {}
        self._untold: list[tuple[Nic, Unknown]] = []  # for tell()
        self._probes = SignalProbes(self._read, "nic-signals")

    def watch(self, nics: Sequence[Nic]) -> None:
        """Judge these NICs from now on; one gone, or renamed, starts afresh."""
        self._nics = {n.pci: n for n in nics}
        for pci, signals in list(self._signals.items()):
            nic = self._nics.get(pci)
            if nic is None or nic.netdev != signals.name:
                del self._signals[pci]
                self._kept.pop(pci, None)
                self._models.pop(pci, None)

    def cause(self, pci: str) -> Signal | None:
        """Why the NIC is Degraded (or worse) by its signals; None while they are in limits."""
        kept = self._kept.get(pci)
        return None if kept is None else kept.cause

    async def probe(self, wait_s: float, up: Callable[[Nic], bool]) -> bool:
        """Read every watched NIC (a round that outlives wait_s answers nothing) and judge
        it, `up` saying whether its link is up now; True when a NIC's cause changed."""
        return self.judge(await self._probes.readings(list(self._nics), wait_s), up)

    def judge(self, probes: Mapping[str, NicProbe], up: Callable[[Nic], bool]) -> bool:
        """Take in one round of probes; True when a NIC's cause changed."""
        nics = {pci: nic for pci, nic in self._nics.items() if pci in probes}
        for pci in nics:
            self._models.setdefault(pci, probes[pci].model)
        # The link state is the netlink monitor's: an operstate can say "unknown".
        readings = {
            pci: dataclasses.replace(probes[pci].reading, up=up(nic)) for pci, nic in nics.items()
        }
        # A NIC whose model sysfs does not show is compared with no other.
        models = {pci: self._models[pci] or f"?{pci}" for pci in readings}
        speeds = {pci: (models[pci], r.speed_mbps) for pci, r in readings.items()}
        expected = expected_speeds(speeds, self._limits.nic_speed_mbps)
        changed = False
        for pci, reading in readings.items():
            nic = nics[pci]
            signals = self._signals.get(pci)
            if signals is None:
                signals = self._signals[pci] = NicSignals(nic.netdev, self._limits, self._clock)
            verdict = signals.observe(reading, expected[pci])
            self._untold += [(nic, unknown) for unknown in verdict.unknown]
            changed |= self._keep(pci, verdict)
        return changed

    def tell(self) -> None:
        """Log the signals found unknown since the last call, each (NIC, signal, reason)
        once: left to the caller so that a watch replaced on a reload tells nothing."""
        for nic, unknown in self._untold:
            log.info(
                "device_signal_unknown",
                device=nic.pci,
                where=f"interface {nic.netdev}",
                signal=unknown.signal,
                reason=unknown.reason,
            )
        self._untold = []

    def _keep(self, pci: str, verdict: DeviceVerdict) -> bool:
        before = self._kept.get(pci)
        if verdict.grade == "healthy":
            self._kept.pop(pci, None)
            return before is not None
        worst = [s for s in verdict.signals if s.grade == verdict.grade]
        names = frozenset(s.signal for s in worst)
        grade = _GRADES[verdict.grade]
        if before is not None and before.signals == names and before.cause.level is grade:
            return False
        first = next((s for s in worst if not s.held), worst[0])
        cause = Signal(first.signal, verdict.message, first.figures, grade)
        self._kept[pci] = _Kept(names, cause)
        return True

    def apply(self, limits: Limits) -> None:
        """New limits (a config reload): they hold from the next probe on."""
        self._limits = limits
        for signals in self._signals.values():
            signals.apply(limits)

    def follow(self, earlier: NicSignalWatch) -> None:
        """Go on from what `earlier` (the watch of the family this one replaces) measured,
        under this watch's limits."""
        self._signals, self._kept = earlier._signals, earlier._kept
        self._models, self._untold = earlier._models, earlier._untold
        self.apply(self._limits)
        self.watch(list(self._nics.values()))

    def close(self) -> None:
        """Let the reading thread go; safe to call twice."""
        self._probes.close()

    def _read(self, pci: str) -> NicProbe:
        """Blocking, in the worker thread."""
        nic = self._nics.get(pci)
        if nic is None:
            raise BackendError(f"NIC {pci} is no longer watched")  # gone since the round began
        return _probe(self._sysfs, nic, self._models.get(pci))
