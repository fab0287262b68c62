"""The degraded-device signals of the RoCE NICs (docs/degraded.md): each NIC's sysfs files
read off the event loop, judged against the configured limits, and the verdict kept as
the cause the cluster is told of, beside the readings the gauges show."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import structlog

from agents.core.degraded import Clock, Limits, Unknown
from agents.core.health import Signal, Signals, signal_cause, signals_of
from agents.core.nic_signals import NicReading, NicSignals, expected_speeds
from agents.core.readings import Readings, nic_readings
from agents.errors import BackendError
from agents.hw.signal_probes import SignalProbes
from agents.hw.sysfs import Sysfs
from agents.roce.discovery import Nic

log = structlog.get_logger(__name__)


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
class Round:
    """What one round of probes changed, and what it read."""

    causes: bool = False  # a NIC's cause changed, if only its figures
    signals: bool = False  # the signals behind a NIC's cause changed: what taints name
    readings: Mapping[str, Readings] = field(default_factory=dict)  # by PCI address


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
        self._causes: dict[str, Signal | Signals] = {}
        self._untold: list[tuple[Nic, Unknown]] = []  # for tell()
        self._probes = SignalProbes(self._read, "nic-signals")

    def watch(self, nics: Sequence[Nic]) -> None:
        """Judge these NICs from now on; one gone, or renamed, starts afresh."""
        self._nics = {n.pci: n for n in nics}
        for pci, signals in list(self._signals.items()):
            nic = self._nics.get(pci)
            if nic is None or nic.netdev != signals.name:
                del self._signals[pci]
                self._causes.pop(pci, None)
                self._models.pop(pci, None)

    def cause(self, pci: str) -> Signal | Signals | None:
        """Why the NIC is Degraded (or worse) by its signals; None while they are in limits."""
        return self._causes.get(pci)

    async def probe(self, wait_s: float, up: Callable[[Nic], bool]) -> Round:
        """Read every watched NIC (a round that outlives wait_s answers nothing) and judge
        it, `up` saying whether its link is up now."""
        return self.judge(await self._probes.readings(list(self._nics), wait_s), up)

    def judge(self, probes: Mapping[str, NicProbe], up: Callable[[Nic], bool]) -> Round:
        """Take in one round of probes."""
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
        causes = renamed = False
        for pci, reading in readings.items():
            nic = nics[pci]
            signals = self._signals.get(pci)
            if signals is None:
                signals = self._signals[pci] = NicSignals(nic.netdev, self._limits, self._clock)
            verdict = signals.observe(reading, expected[pci])
            self._untold += [(nic, unknown) for unknown in verdict.unknown]
            before, cause = self._causes.pop(pci, None), signal_cause(verdict.signals)
            if cause is not None:
                self._causes[pci] = cause
            causes |= cause != before
            renamed |= _named(cause) != _named(before)
        gauges = {pci: nic_readings(r, expected[pci]) for pci, r in readings.items()}
        return Round(causes, renamed, gauges)

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

    def apply(self, limits: Limits) -> None:
        """New limits (a config reload): they hold from the next probe on."""
        self._limits = limits
        for signals in self._signals.values():
            signals.apply(limits)

    def follow(self, earlier: NicSignalWatch) -> None:
        """Go on from what `earlier` (the watch of the family this one replaces) measured,
        under this watch's limits."""
        self._signals, self._causes = earlier._signals, earlier._causes
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


def _named(cause: Signal | Signals | None) -> tuple[tuple[str, object], ...]:
    """The signals behind a cause and their grades, without their figures."""
    return tuple((s.name, s.level) for s in signals_of(cause))
