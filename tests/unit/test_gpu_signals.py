"""The GPU signals of a degraded device, each both ways (Degraded, then Healthy after the
hold) on an injected clock, and what leaves a signal unknown."""

from __future__ import annotations

import dataclasses

import pytest

from agents.core.degraded import BACKWARDS, NOT_OFFERED, DeviceVerdict, Limits, Unknown
from agents.core.gpu_signals import GpuReading, GpuSignals

HOLD_S = 60.0
# An H100 at rest in a Gen5 x16 slot, every query answered.
WELL = GpuReading(
    pcie_width=16,
    pcie_max_width=16,
    pcie_gen=5,
    pcie_max_gen=5,
    utilization=0,
    pcie_replays=0,
    nvlinks=(True,) * 18,
    clock_events=0,
    remap_pending=False,
    remap_failed=False,
    retired_pages_pending=False,
    recovery_action=0,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gpu(hold_s: float = HOLD_S) -> tuple[GpuSignals, Clock]:
    clock = Clock()
    return GpuSignals(Limits(hold_s=hold_s), clock), clock


def changed(**fields: object) -> GpuReading:
    return dataclasses.replace(WELL, **fields)  # type: ignore[arg-type]


def signals(v: DeviceVerdict) -> list[str]:
    return [s.signal for s in v.signals]


# (signal, the reading that is out of limits, grade, its message)
CASES = [
    ("pcie-width", changed(pcie_width=8), "degraded", "PCIe link x8 of x16"),
    (
        "pcie-gen",
        changed(pcie_gen=3, utilization=87),
        "degraded",
        "PCIe gen 3 of 5 at 87 % utilization",
    ),
    ("nvlink-down", changed(nvlinks=(False, False) + (True,) * 16), "degraded", None),
    ("row-remap-pending", changed(remap_pending=True), "degraded", None),
    ("retired-pages-pending", changed(retired_pages_pending=True), "degraded", None),
    ("row-remap-failed", changed(remap_failed=True), "unhealthy", None),
    ("recovery-action", changed(recovery_action=1), "unhealthy", None),
    ("recovery-action", changed(recovery_action=2), "unhealthy", None),
    ("recovery-action", changed(recovery_action=4), "unhealthy", None),
    ("recovery-action", changed(recovery_action=3), "degraded", None),
]


@pytest.mark.parametrize(
    ("signal", "bad", "grade", "message"),
    CASES,
    ids=[f"{c[0]}-{c[1].recovery_action}" for c in CASES],
)
def test_signal_out_of_limits_then_healthy_after_the_hold(
    signal: str, bad: GpuReading, grade: str, message: str | None
) -> None:
    signals_, clock = gpu()
    assert signals_.observe(WELL).level == "healthy"
    clock.now += 5
    out = signals_.observe(bad)
    assert (out.level, signals(out)) == (grade, [signal])
    if message is not None:
        assert out.message == message
    clock.now += 5
    back = signals_.observe(WELL)  # within limits again: held
    assert back.level == grade and back.signals[0].held
    clock.now += HOLD_S - 5.5
    assert signals_.observe(WELL).level == grade  # 59.5 s after the last bad probe
    clock.now += 0.5
    assert signals_.observe(WELL).level == "healthy"


def test_nvlink_message_counts_links_down_of_those_seen_active() -> None:
    signals_, _ = gpu()
    signals_.observe(WELL)
    out = signals_.observe(changed(nvlinks=(False, False) + (True,) * 16))
    assert out.message == "NVLink 2 of 18 links down"
    assert dict(out.signals[0].figures) == {"down": 2, "links": 18}


def test_nvlink_never_active_since_start_is_not_down() -> None:
    signals_, _ = gpu()
    assert signals_.observe(changed(nvlinks=(False,) * 6 + (True,) * 12)).level == "healthy"


def test_nvlink_baseline_starts_again_after_a_reset() -> None:
    signals_, clock = gpu()
    signals_.observe(WELL)
    half = changed(nvlinks=(True,) * 9 + (False,) * 9)
    assert signals_.observe(half).level == "degraded"
    signals_.reset()
    clock.now += 5
    assert signals_.observe(half).level == "healthy"


def test_pcie_gen_below_max_is_fine_at_idle() -> None:
    signals_, _ = gpu()
    assert signals_.observe(changed(pcie_gen=1, utilization=49)).level == "healthy"
    assert signals_.observe(changed(pcie_gen=1, utilization=50)).level == "degraded"


def test_pcie_gen_below_max_without_utilization_is_unknown_not_degraded() -> None:
    signals_, _ = gpu()
    out = signals_.observe(changed(pcie_gen=3, utilization=None))
    assert out.level == "healthy"
    assert Unknown("pcie-gen", "utilization not offered") in out.unknown


def test_hw_slowdown_needs_three_probes_in_a_row() -> None:
    signals_, clock = gpu()
    thermal = changed(clock_events=0x40 | 0x1)  # thermal slowdown, and GPU idle (not HW)
    assert signals_.observe(thermal).level == "healthy"
    assert signals_.observe(thermal).level == "healthy"
    assert signals_.observe(WELL).level == "healthy"  # the run is broken
    for _ in range(2):
        clock.now += 5
        assert signals_.observe(changed(clock_events=0x8)).level == "healthy"
    clock.now += 5
    out = signals_.observe(changed(clock_events=0x8 | 0x80))
    assert out.level == "degraded"
    assert out.message == "hwSlowdown, hwPowerBrake on 3 probes in a row"
    clock.now += HOLD_S
    assert signals_.observe(WELL).level == "healthy"


def test_software_clock_events_are_not_a_slowdown() -> None:
    signals_, _ = gpu()
    for _ in range(5):  # idle, application clocks, SW power cap, SW thermal
        assert signals_.observe(changed(clock_events=0x1 | 0x2 | 0x4 | 0x20)).level == "healthy"


@pytest.mark.parametrize(
    ("gen", "width", "limit"),
    [
        pytest.param(5, 16, 30.72, id="gen5-x16"),
        pytest.param(4, 16, 15.36, id="gen4-x16"),
        pytest.param(6, 16, 61.44, id="gen6-x16"),
        pytest.param(5, 8, 15.36, id="gen5-x8"),
        pytest.param(3, 16, 15.36, id="gen3-takes-gen4"),
    ],
)
def test_pcie_replays_over_the_minute_limit_by_generation_and_width(
    gen: int, width: int, limit: float
) -> None:
    signals_, clock = gpu()
    base = changed(pcie_max_gen=gen, pcie_gen=gen, pcie_max_width=width, pcie_width=width)
    signals_.observe(dataclasses.replace(base, pcie_replays=100))
    clock.now += 30
    at_limit = int(limit)  # the most that is within limits
    out = signals_.observe(dataclasses.replace(base, pcie_replays=100 + at_limit))
    assert out.level == "healthy"
    clock.now += 5
    out = signals_.observe(dataclasses.replace(base, pcie_replays=100 + at_limit + 1))
    assert out.level == "degraded"
    assert dict(out.signals[0].figures) == {"replays": at_limit + 1, "limit": limit}


def test_pcie_replays_spread_over_more_than_a_minute_stay_within_limits() -> None:
    signals_, clock = gpu()
    count = 0
    for _ in range(40):  # 20 replays every 50 s: 20 a minute at most, limit 30.72
        out = signals_.observe(changed(pcie_replays=count))
        assert out.level == "healthy"
        clock.now += 50
        count += 20


def test_pcie_replays_back_to_healthy_once_the_burst_left_the_window_and_the_hold() -> None:
    signals_, clock = gpu()
    start = clock.now
    signals_.observe(changed(pcie_replays=0))
    grades = {}
    while clock.now < start + 130:
        clock.now += 5
        grades[clock.now - start] = signals_.observe(changed(pcie_replays=500)).level
    # The burst counts until its start leaves the 60 s window, then the hold runs 60 s.
    assert {t for t, g in grades.items() if g == "degraded"} == set(range(5, 120, 5))


def test_replay_counter_going_backwards_is_unknown_once_and_never_degraded() -> None:
    signals_, clock = gpu()
    signals_.observe(changed(pcie_replays=10_000))
    clock.now += 5
    out = signals_.observe(changed(pcie_replays=3))  # wrapped or reset
    assert out.level == "healthy"
    assert out.unknown == (Unknown("pcie-replays", BACKWARDS),)
    clock.now += 5
    assert signals_.observe(changed(pcie_replays=4)).unknown == ()
    clock.now += 5
    again = signals_.observe(changed(pcie_replays=0))
    assert again.level == "healthy" and again.unknown == ()  # told once


def test_nothing_offered_is_healthy_and_every_signal_told_unknown_once() -> None:
    signals_, _ = gpu()
    first = signals_.observe(GpuReading())
    assert first.level == "healthy"
    assert {u.signal for u in first.unknown} == {
        *("pcie-width", "pcie-gen", "pcie-replays", "nvlink-down", "hw-slowdown"),
        *("row-remap-pending", "row-remap-failed", "retired-pages-pending", "recovery-action"),
        "nvlink-fabric",
    }
    assert all(u.reason == NOT_OFFERED for u in first.unknown)
    assert signals_.observe(GpuReading()).unknown == ()


@pytest.mark.parametrize(
    "odd",
    [
        pytest.param(changed(pcie_width=0), id="width-zero"),
        pytest.param(changed(pcie_max_width=None), id="max-width-missing"),
        pytest.param(changed(pcie_gen=None, utilization=100), id="gen-missing"),
        pytest.param(changed(nvlinks=None), id="no-nvlink"),
        pytest.param(changed(remap_pending=None, remap_failed=None), id="no-row-remapping"),
        pytest.param(changed(recovery_action=7), id="recovery-value-unknown"),
        pytest.param(changed(clock_events=None), id="no-clock-events"),
    ],
)
def test_an_odd_or_missing_answer_never_marks_degraded(odd: GpuReading) -> None:
    signals_, clock = gpu()
    for _ in range(4):
        out = signals_.observe(odd)
        assert out.level == "healthy"
        clock.now += 5


def test_unhealthy_outranks_degraded_and_names_its_own_message() -> None:
    signals_, _ = gpu()
    out = signals_.observe(changed(pcie_width=4, remap_failed=True, remap_pending=True))
    assert out.level == "unhealthy"
    assert signals(out) == ["pcie-width", "row-remap-failed", "row-remap-pending"]
    assert out.message == "row remapping failed: the GPU needs replacing"


def test_hold_counts_from_the_last_probe_out_of_limits() -> None:
    signals_, clock = gpu(hold_s=10)
    signals_.observe(changed(pcie_width=8))
    clock.now += 8
    signals_.observe(changed(pcie_width=8))  # still out: the hold starts again
    clock.now += 8
    assert signals_.observe(WELL).level == "degraded"
    clock.now += 2
    assert signals_.observe(WELL).level == "healthy"


def test_zero_hold_is_healthy_at_the_first_probe_within_limits() -> None:
    signals_, clock = gpu(hold_s=0)
    assert signals_.observe(changed(pcie_width=8)).level == "degraded"
    clock.now += 5
    assert signals_.observe(WELL).level == "healthy"


def test_an_idle_h200_as_its_nvml_answers_is_healthy() -> None:
    """What NVML (driver 580.159.04) answered on an idle H200 without NVLink: Gen5 x16,
    clock event reason 0x1 (GPU idle), NOT_SUPPORTED for NVLink states and retired
    pages, recovery action NONE."""
    signals_, clock = gpu()
    h200 = GpuReading(
        pcie_width=16,
        pcie_max_width=16,
        pcie_gen=5,
        pcie_max_gen=5,
        utilization=0,
        pcie_replays=0,
        nvlinks=None,
        clock_events=0x1,
        remap_pending=False,
        remap_failed=False,
        retired_pages_pending=None,
        recovery_action=0,
    )
    for _ in range(5):
        out = signals_.observe(h200)
        assert out.level == "healthy"
        clock.now += 5
    assert {u.signal for u in signals_.observe(h200).unknown} == set()


def test_a_new_hold_applies_to_what_is_held_now() -> None:
    signals_, clock = gpu(hold_s=600)
    signals_.observe(changed(pcie_width=8))
    clock.now += 30
    assert signals_.observe(WELL).level == "degraded"
    signals_.apply(Limits(hold_s=20))
    clock.now += 1
    assert signals_.observe(WELL).level == "healthy"
