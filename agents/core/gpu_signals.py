"""The GPU signals of a degraded device (docs/degraded.md), judged from successive NVML
readings of one GPU: each reading field is None where NVML does not offer it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
from agents.core.fabric_health import judge_fabric
from agents.core.gfd_facts import Fabric

LOADED_PERCENT = 50  # at lower utilization a GPU may lower its PCIe generation to save power
REPLAY_WINDOW_S = 60.0
# PCIe replays allowed per lane per minute, by the link's generation (DCGM's limits);
# below Gen4 Gen4's figure applies, above Gen6 Gen6's.
REPLAYS_PER_LANE_MINUTE = {4: 0.96, 5: 1.92, 6: 3.84}
SLOWDOWN_PROBES = 3  # hardware slowdown on this many probes in a row
# NVML's clock event reasons that the hardware imposes, by bit.
CLOCK_EVENTS = {0x8: "hwSlowdown", 0x40: "hwThermalSlowdown", 0x80: "hwPowerBrake"}
# NVML's GPU recovery actions (field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), by value.
RECOVERY_NONE = 0
RECOVERY_UNHEALTHY = {1: "GPU_RESET", 2: "NODE_REBOOT", 4: "DRAIN_AND_RESET"}
RECOVERY_DEGRADED = {3: "DRAIN_P2P"}


@dataclass(frozen=True)
class GpuReading:
    """One probe of one GPU through NVML; None: not offered, or an odd answer."""

    pcie_width: int | None = None
    pcie_max_width: int | None = None
    pcie_gen: int | None = None
    pcie_max_gen: int | None = None
    utilization: int | None = None  # percent of time a kernel ran
    pcie_replays: int | None = None  # NVML's replay counter, only ever grows
    nvlinks: tuple[bool, ...] | None = None  # per link: active now
    clock_events: int | None = None  # NVML's clock event reasons, a bit mask
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    retired_pages_pending: bool | None = None
    recovery_action: int | None = None
    # Telemetry, judged by no signal: only gauged (agents/core/readings.py).
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    power_watts: float | None = None
    temperature_celsius: int | None = None
    sm_clock_mhz: int | None = None
    fabric: Fabric | None = None  # the NVLink fabric it registered with; None: none


class GpuSignals:
    """The signals of one GPU; `observe` each reading in turn, `reset` after a GPU reset."""

    def __init__(self, limits: Limits, clock: Clock) -> None:
        self._clock = clock
        self._hold = Hold(limits.hold_s)
        self._replays = CounterWindow(REPLAY_WINDOW_S)
        self._links: set[int] = set()  # links active since the start or the last reset
        self._slow = 0  # probes in a row with a hardware slowdown

    def apply(self, limits: Limits) -> None:
        """New limits (a config reload): they hold from the next probe on."""
        self._hold.hold_s = limits.hold_s

    def reset(self) -> None:
        """The GPU was reset: links are counted afresh, held verdicts are dropped."""
        self._links.clear()
        self._replays.clear()
        self._slow = 0
        self._hold.clear()

    def observe(self, r: GpuReading) -> DeviceVerdict:
        now = self._clock()
        out: list[SignalVerdict] = []
        unknown: list[Unknown] = []
        for judge in (
            _pcie_width,
            _pcie_gen,
            self._pcie_replays,
            self._nvlink_down,
            self._hw_slowdown,
            _memory,
            _recovery,
            _nvlink_fabric,
        ):
            verdicts, unknowns = judge(r, now)
            out += verdicts
            unknown += unknowns
        return self._hold.verdict(now, out, unknown)

    def _pcie_replays(self, r: GpuReading, now: float) -> _Judged:
        if r.pcie_replays is None or r.pcie_max_width is None or r.pcie_max_gen is None:
            return [], [Unknown("pcie-replays", NOT_OFFERED)]
        grown = self._replays.add(now, r.pcie_replays)
        if grown is None:
            return [], [Unknown("pcie-replays", BACKWARDS)]
        gen = min(max(r.pcie_max_gen, 4), 6)
        limit = round(REPLAYS_PER_LANE_MINUTE[gen] * r.pcie_max_width, 2)
        if grown <= limit:
            return [], []
        message = f"PCIe replays {grown} in the last 60 s, limit {limit:g}"
        figures = (("replays", grown), ("limit", limit))
        return [SignalVerdict("pcie-replays", "degraded", message, figures)], []

    def _nvlink_down(self, r: GpuReading, now: float) -> _Judged:
        if r.nvlinks is None:
            return [], [Unknown("nvlink-down", NOT_OFFERED)]
        active = {i for i, up in enumerate(r.nvlinks) if up}
        self._links |= active
        down = len(self._links - active)
        if not down:
            return [], []
        message = f"NVLink {down} of {len(self._links)} links down"
        figures = (("down", down), ("links", len(self._links)))
        return [SignalVerdict("nvlink-down", "degraded", message, figures)], []

    def _hw_slowdown(self, r: GpuReading, now: float) -> _Judged:
        if r.clock_events is None:
            self._slow = 0  # an unanswered probe breaks the run
            return [], [Unknown("hw-slowdown", NOT_OFFERED)]
        reasons = [name for bit, name in CLOCK_EVENTS.items() if r.clock_events & bit]
        self._slow = self._slow + 1 if reasons else 0
        if self._slow < SLOWDOWN_PROBES:
            return [], []
        message = f"{', '.join(reasons)} on {self._slow} probes in a row"
        figures = (("reasons", ",".join(reasons)), ("probes", self._slow))
        return [SignalVerdict("hw-slowdown", "degraded", message, figures)], []


_Judged = tuple[list[SignalVerdict], list[Unknown]]


def _pcie_width(r: GpuReading, now: float) -> _Judged:
    width, top = r.pcie_width, r.pcie_max_width
    if width is None or top is None or width <= 0 or top <= 0:
        return [], [Unknown("pcie-width", NOT_OFFERED)]
    if width >= top:
        return [], []
    figures = (("width", width), ("maxWidth", top))
    return [SignalVerdict("pcie-width", "degraded", f"PCIe link x{width} of x{top}", figures)], []


def _pcie_gen(r: GpuReading, now: float) -> _Judged:
    gen, top, load = r.pcie_gen, r.pcie_max_gen, r.utilization
    if gen is None or top is None or gen <= 0 or top <= 0:
        return [], [Unknown("pcie-gen", NOT_OFFERED)]
    if gen >= top:
        return [], []
    if load is None:  # a lower generation is a fault only under load
        return [], [Unknown("pcie-gen", "utilization not offered")]
    if load < LOADED_PERCENT:
        return [], []
    message = f"PCIe gen {gen} of {top} at {load} % utilization"
    figures = (("gen", gen), ("maxGen", top), ("utilization", load))
    return [SignalVerdict("pcie-gen", "degraded", message, figures)], []


def _memory(r: GpuReading, now: float) -> _Judged:
    out: list[SignalVerdict] = []
    unknown: list[Unknown] = []
    if r.remap_failed is None or r.remap_pending is None:
        unknown += [Unknown("row-remap-pending", NOT_OFFERED)]
        unknown += [Unknown("row-remap-failed", NOT_OFFERED)]
    else:
        if r.remap_failed:
            message = "row remapping failed: the GPU needs replacing"
            out.append(SignalVerdict("row-remap-failed", "unhealthy", message))
        if r.remap_pending:
            message = "row remap pending: a GPU reset applies it"
            out.append(SignalVerdict("row-remap-pending", "degraded", message))
    if r.retired_pages_pending is None:
        unknown.append(Unknown("retired-pages-pending", NOT_OFFERED))
    elif r.retired_pages_pending:
        message = "page retirement pending: a GPU reset applies it"
        out.append(SignalVerdict("retired-pages-pending", "degraded", message))
    return out, unknown


def _nvlink_fabric(r: GpuReading, now: float) -> _Judged:
    return judge_fabric(r.fabric)


def _recovery(r: GpuReading, now: float) -> _Judged:
    action = r.recovery_action
    if action is None:
        return [], [Unknown("recovery-action", NOT_OFFERED)]
    if action == RECOVERY_NONE:
        return [], []
    name = RECOVERY_UNHEALTHY.get(action) or RECOVERY_DEGRADED.get(action)
    if name is None:
        return [], [Unknown("recovery-action", f"value {action} not known")]
    grade: Literal["degraded", "unhealthy"] = (
        "unhealthy" if action in RECOVERY_UNHEALTHY else "degraded"
    )
    message = f"NVML asks for recovery action {name}"
    return [SignalVerdict("recovery-action", grade, message, (("action", name),))], []
