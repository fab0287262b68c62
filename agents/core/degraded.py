"""Degraded devices (docs/degraded.md): the verdict types every signal gives, the limits
from the config, and the hold that keeps a device Degraded until its signals settle.

Pure: the callers pass readings and a clock; nothing here reads hardware or time.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Literal

# How bad a verdict is, in the words of the signal tables; the device's grade that follows
# from it is agents.core.health.Grade.
Level = Literal["healthy", "degraded", "unhealthy"]
Figure = int | float | str
Clock = Callable[[], float]  # seconds, monotonic
PROBE_INTERVAL_S = 5.0  # counters are read at most this often
_RANK: dict[Level, int] = {"healthy": 0, "degraded": 1, "unhealthy": 2}


@dataclass(frozen=True)
class Limits:
    """The thresholds of `health.degraded` that the signals use."""

    hold_s: float = 60.0  # every signal within limits this long before Healthy again
    nic_speed_mbps: int = 0  # 0: the highest speed among the node's NICs of the same model
    rdma_errors_per_minute: int = 10


@dataclass(frozen=True)
class SignalVerdict:
    """One signal out of limits: its name, its level, the figures behind it, and what an
    operator reads (`PCIe link x8 of x16`). `held`: within limits again, but not yet for
    the hold time, so the device keeps this level."""

    signal: str
    level: Literal["degraded", "unhealthy"]
    message: str
    figures: tuple[tuple[str, Figure], ...] = ()
    held: bool = False


@dataclass(frozen=True)
class Unknown:
    """A signal that cannot be judged: NVML or sysfs does not offer it, or its counter
    went backwards. It never makes a device Degraded; each (signal, reason) is told once."""

    signal: str
    reason: str


@dataclass(frozen=True)
class DeviceVerdict:
    """What one probe of one device comes to."""

    signals: tuple[SignalVerdict, ...] = ()  # out of limits now, or held
    unknown: tuple[Unknown, ...] = ()  # newly unknown at this probe: for the caller to log

    @property
    def level(self) -> Level:
        levels: list[Level] = ["healthy", *(s.level for s in self.signals)]
        return max(levels, key=_RANK.__getitem__)

    @property
    def message(self) -> str:
        """The messages of the signals of the device's level, joined."""
        return "; ".join(s.message for s in self.signals if s.level == self.level)


class Hold:
    """Keeps each signal's last out-of-limits verdict until it has been within limits for
    hold_s; tells each Unknown once."""

    def __init__(self, hold_s: float) -> None:
        self.hold_s = hold_s
        self._last: dict[str, tuple[SignalVerdict, float]] = {}
        self._told: set[Unknown] = set()

    def verdict(
        self, now: float, out: Iterable[SignalVerdict], unknown: Iterable[Unknown]
    ) -> DeviceVerdict:
        for v in out:
            self._last[v.signal] = (v, now)
        current = {v.signal for v, at in self._last.values() if at == now}
        kept: list[SignalVerdict] = []
        for signal, (v, at) in sorted(self._last.items()):
            if signal in current:
                kept.append(v)
            elif now - at < self.hold_s:
                kept.append(replace(v, held=True))
            else:
                del self._last[signal]
        fresh = [u for u in dict.fromkeys(unknown) if u not in self._told]
        self._told.update(fresh)
        return DeviceVerdict(tuple(kept), tuple(fresh))

    def clear(self) -> None:
        """Forget what was out of limits (the device was reset or replaced)."""
        self._last.clear()


class CounterWindow:
    """The growth of a counter that only ever grows, over the last window_s seconds."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, value: int) -> int | None:
        """The growth within the window up to this sample; None when the counter went
        backwards (wrapped, or was reset): the window starts again from this sample."""
        if self._samples and value < self._samples[-1][1]:
            self._samples.clear()
            self._samples.append((now, value))
            return None
        self._samples.append((now, value))
        while self._samples[0][0] < now - self.window_s:
            self._samples.popleft()
        return value - self._samples[0][1]

    def clear(self) -> None:
        self._samples.clear()


BACKWARDS = "counter went backwards (wrapped or reset)"
NOT_OFFERED = "not offered"
