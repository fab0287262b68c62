"""Each GPU's degraded-device signals (docs/degraded.md): read through NVML off the event
loop, judged by one GpuSignals per GPU, and told as the GPU's Signal cause."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import structlog

from agents.core.degraded import DeviceVerdict, Limits
from agents.core.gpu_signals import GpuReading, GpuSignals
from agents.core.health import Grade, Signal
from agents.hw.nvml import GpuProbe
from agents.hw.signal_probes import SignalProbes

log = structlog.get_logger(__name__)


class GpuSignalWatch:
    """The signals of these GPUs: `read` one round, then ask each GPU's `cause`."""

    def __init__(
        self, nvml: object, uuids: Iterable[str], limits: Limits, clock: Callable[[], float]
    ) -> None:
        self._nvml = nvml  # asked for its probe only when there are GPUs to read
        self._probes: SignalProbes[GpuReading] | None = None
        self._signals = {uuid: GpuSignals(limits, clock) for uuid in uuids}
        self._verdicts: dict[str, DeviceVerdict] = {}

    @property
    def active(self) -> bool:
        """Whether there is something to read: GPUs, and an NVML that offers the signals
        (one that does not judges every GPU by its status alone)."""
        return bool(self._signals) and isinstance(self._nvml, GpuProbe)

    def take_over(self, earlier: GpuSignalWatch, limits: Limits) -> None:
        """Go on from `earlier`'s signals (a reload), on `limits` from the next probe."""
        for uuid, signals in earlier._signals.items():
            if uuid in self._signals:
                signals.apply(limits)
                self._signals[uuid] = signals
        self._verdicts = {u: v for u, v in earlier._verdicts.items() if u in self._signals}

    def reset(self, uuid: str) -> None:
        """The GPU answers again after it was lost (a reset): judge it afresh."""
        if uuid in self._signals:
            self._signals[uuid].reset()
            self._verdicts.pop(uuid, None)

    async def read(self, uuids: Iterable[str], wait_s: float) -> dict[str, GpuReading]:
        """One round of readings of `uuids` (a GPU whose probe failed keeps its verdict:
        the status probe tells whether it is lost); the readings this round got."""
        if self._probes is None:
            if not self.active:
                return {}
            assert isinstance(self._nvml, GpuProbe)
            self._probes = SignalProbes(self._nvml.probe, "nvml-signals")
        chosen = [u for u in uuids if u in self._signals]
        readings = await self._probes.readings(chosen, wait_s)
        for uuid, reading in readings.items():
            verdict = self._signals[uuid].observe(reading)
            for unknown in verdict.unknown:
                log.info(
                    "device_signal_unknown",
                    device=uuid,
                    signal=unknown.signal,
                    reason=unknown.reason,
                )
            self._verdicts[uuid] = verdict
        return readings

    def cause(self, uuid: str) -> Signal | None:
        """The GPU's signal out of limits (or held), None while all are within them."""
        verdict = self._verdicts.get(uuid)
        if verdict is None or verdict.level == "healthy":
            return None
        first = next(s for s in verdict.signals if s.level == verdict.level)
        level = Grade.UNHEALTHY if verdict.level == "unhealthy" else Grade.DEGRADED
        return Signal(first.signal, verdict.message, first.figures, level)

    def close(self) -> None:
        if self._probes is not None:
            self._probes.close()
