"""The NIC signals of a degraded device (docs/degraded.md), judged from successive sysfs
readings of one RoCE NIC: link speed, RDMA error counters, carrier changes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from agents.core.degraded import (
    BACKWARDS,
    NOT_OFFERED,
    Clock,
    CounterWindow,
    DeviceVerdict,
    Hold,
    Limits,
    SignalVerdict,
    Unknown,
)

# The port counters (ports/<p>/counters/) and the device's own (ports/<p>/hw_counters/)
# whose growth means a bad link or lost RDMA packets.
PORT_COUNTERS = ("symbol_error", "link_error_recovery", "port_rcv_errors")
HW_COUNTERS = ("local_ack_timeout_err", "rnr_nak_retry_err", "out_of_sequence", "packet_seq_err")
RDMA_WINDOW_S = 60.0
FLAP_WINDOW_S = 600.0
FLAP_LIMIT = 2  # carrier changes allowed in the window: one down and up again


@dataclass(frozen=True)
class NicReading:
    """One probe of one NIC through sysfs; None: the file is absent or odd."""

    speed_mbps: int | None = None
    carrier_changes: int | None = None
    up: bool | None = None  # the interface's link is up now
    counters: tuple[tuple[str, int], ...] = ()  # the error counters present, by name


def expected_speeds(
    nics: Mapping[str, tuple[str, int | None]], configured_mbps: int
) -> dict[str, int | None]:
    """Per NIC (name -> (model, speed now)), the speed it should run at: the configured
    one, or else the highest among the NICs of its model (vendor:device); None where no
    NIC of the model reports a speed."""
    if configured_mbps > 0:
        return dict.fromkeys(nics, configured_mbps)
    best: dict[str, int] = {}
    for model, speed in nics.values():
        if speed is not None and speed > 0:
            best[model] = max(best.get(model, 0), speed)
    return {name: best.get(model) for name, (model, _) in nics.items()}


class NicSignals:
    """The signals of one NIC, named `name` (its interface) in messages."""

    def __init__(self, name: str, limits: Limits, clock: Clock) -> None:
        self.name = name
        self._limit = limits.rdma_errors_per_minute
        self._clock = clock
        self._hold = Hold(limits.hold_s)
        self._counters: dict[str, CounterWindow] = {}
        self._carrier = CounterWindow(FLAP_WINDOW_S)

    def apply(self, limits: Limits) -> None:
        """New limits (a config reload): they hold from the next probe on."""
        self._limit = limits.rdma_errors_per_minute
        self._hold.hold_s = limits.hold_s

    def observe(self, r: NicReading, expected_mbps: int | None) -> DeviceVerdict:
        now = self._clock()
        out: list[SignalVerdict] = []
        unknown: list[Unknown] = []
        for verdicts, unknowns in (
            self._speed(r, expected_mbps),
            self._rdma_errors(r, now),
            self._flaps(r, now),
        ):
            out += verdicts
            unknown += unknowns
        return self._hold.verdict(now, out, unknown)

    def _speed(self, r: NicReading, expected: int | None) -> _Judged:
        if r.up is False:
            return [], []  # a link that is down has no speed; down is Unhealthy elsewhere
        if r.speed_mbps is None or r.speed_mbps <= 0 or expected is None:
            return [], [Unknown("link-speed", NOT_OFFERED)]
        if r.speed_mbps >= expected:
            return [], []
        message = f"{self.name} at {r.speed_mbps} Mb/s, expected {expected}"
        figures = (("speedMbps", r.speed_mbps), ("expectedMbps", expected))
        return [SignalVerdict("link-speed", "degraded", message, figures)], []

    def _rdma_errors(self, r: NicReading, now: float) -> _Judged:
        if not r.counters:
            return [], [Unknown("rdma-errors", NOT_OFFERED)]
        grown: list[tuple[str, int]] = []
        unknown: list[Unknown] = []
        for name, value in r.counters:
            window = self._counters.setdefault(name, CounterWindow(RDMA_WINDOW_S))
            growth = window.add(now, value)
            if growth is None:
                unknown.append(Unknown(f"rdma-errors/{name}", BACKWARDS))
            elif growth > self._limit:
                grown.append((name, growth))
        if not grown:
            return [], unknown
        said = ", ".join(f"{name} +{n}" for name, n in grown)
        message = f"{self.name} RDMA errors in the last minute: {said} (limit {self._limit})"
        figures = (*grown, ("limit", self._limit))
        return [SignalVerdict("rdma-errors", "degraded", message, figures)], unknown

    def _flaps(self, r: NicReading, now: float) -> _Judged:
        if r.carrier_changes is None or r.up is None:
            return [], [Unknown("link-flaps", NOT_OFFERED)]
        changes = self._carrier.add(now, r.carrier_changes)
        if changes is None:
            return [], [Unknown("link-flaps", BACKWARDS)]
        if not r.up or changes <= FLAP_LIMIT:
            return [], []
        message = f"{self.name} link changed {changes} times in the last 10 minutes"
        figures = (("changes", changes), ("limit", FLAP_LIMIT))
        return [SignalVerdict("link-flaps", "degraded", message, figures)], []


_Judged = tuple[list[SignalVerdict], list[Unknown]]
