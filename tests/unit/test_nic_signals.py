"""The NIC signals of a degraded device, each both ways on an injected clock, the expected
link speed, and what leaves a signal unknown."""

from __future__ import annotations

import dataclasses

import pytest

from agents.core.degraded import BACKWARDS, NOT_OFFERED, Limits, Unknown
from agents.core.nic_signals import NicReading, NicSignals, expected_speeds

HOLD_S = 60.0
COUNTERS = {
    "symbol_error": 0,
    "link_error_recovery": 0,
    "port_rcv_errors": 0,
    "local_ack_timeout_err": 0,
}
WELL = NicReading(speed_mbps=400000, carrier_changes=1, up=True, counters=tuple(COUNTERS.items()))


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def nic(limit: int = 10) -> tuple[NicSignals, Clock]:
    clock = Clock()
    return NicSignals("ens1np0", Limits(HOLD_S, 0, limit), clock), clock


def counters(**grown: int) -> NicReading:
    return dataclasses.replace(WELL, counters=tuple({**COUNTERS, **grown}.items()))


def test_link_speed_below_expected_then_healthy_after_the_hold() -> None:
    signals, clock = nic()
    assert signals.observe(WELL, 400000).level == "healthy"
    slow = signals.observe(dataclasses.replace(WELL, speed_mbps=100000), 400000)
    assert slow.level == "degraded"
    assert slow.message == "ens1np0 at 100000 Mb/s, expected 400000"
    assert dict(slow.signals[0].figures) == {"speedMbps": 100000, "expectedMbps": 400000}
    clock.now += HOLD_S - 1
    assert signals.observe(WELL, 400000).level == "degraded"
    clock.now += 1
    assert signals.observe(WELL, 400000).level == "healthy"


def test_link_speed_of_a_link_that_is_down_is_not_judged() -> None:
    signals, _ = nic()
    down = NicReading(speed_mbps=None, carrier_changes=2, up=False, counters=WELL.counters)
    out = signals.observe(down, 400000)
    assert out.level == "healthy"
    assert not any(u.signal == "link-speed" for u in out.unknown)


@pytest.mark.parametrize(
    ("speed", "expected"),
    [
        pytest.param(None, 400000, id="speed-absent"),
        pytest.param(-1, 400000, id="speed-unknown-to-the-driver"),
        pytest.param(100000, None, id="nothing-to-compare-with"),
    ],
)
def test_link_speed_unknown_never_degraded(speed: int | None, expected: int | None) -> None:
    signals, _ = nic()
    out = signals.observe(dataclasses.replace(WELL, speed_mbps=speed), expected)
    assert out.level == "healthy"
    assert Unknown("link-speed", NOT_OFFERED) in out.unknown


def test_expected_speed_is_the_highest_of_the_same_model_or_the_configured_one() -> None:
    nics = {
        "ens1np0": ("15b3:1021", 100000),
        "ens2np0": ("15b3:1021", 400000),
        "ens3np0": ("15b3:1021", None),
        "eth0": ("8086:1593", 25000),
        "eth1": ("8086:1593", -1),
    }
    assert expected_speeds(nics, 0) == {
        "ens1np0": 400000,
        "ens2np0": 400000,
        "ens3np0": 400000,
        "eth0": 25000,
        "eth1": 25000,
    }
    assert set(expected_speeds(nics, 200000).values()) == {200000}
    assert expected_speeds({"a": ("15b3:1021", None)}, 0) == {"a": None}


def test_rdma_errors_growing_over_the_limit_in_a_minute_then_healthy() -> None:
    signals, clock = nic(limit=10)
    signals.observe(WELL, None)
    clock.now += 30
    assert signals.observe(counters(symbol_error=10), None).level == "healthy"
    clock.now += 5
    out = signals.observe(counters(symbol_error=25, packet_seq_err=1), None)
    assert out.level == "degraded"
    assert out.message == ("ens1np0 RDMA errors in the last minute: symbol_error +25 (limit 10)")
    steady = counters(symbol_error=25, packet_seq_err=1)
    clock.now += 5  # the growth is still within the minute
    assert signals.observe(steady, None).signals[0].held is False
    clock.now += HOLD_S - 1
    assert signals.observe(steady, None).level == "degraded"
    clock.now += 1
    assert signals.observe(steady, None).level == "healthy"


def test_rdma_errors_at_a_steady_low_rate_stay_healthy() -> None:
    signals, clock = nic(limit=10)
    for minute in range(30):  # 10 a minute, exactly the limit
        for tick in range(12):
            value = minute * 10 + (10 * tick) // 12
            out = signals.observe(counters(port_rcv_errors=value), None)
            assert out.level == "healthy"
            clock.now += 5


def test_rdma_counter_going_backwards_is_unknown_once_not_degraded() -> None:
    signals, clock = nic(limit=10)
    signals.observe(counters(symbol_error=1_000_000), None)
    clock.now += 5
    out = signals.observe(counters(symbol_error=2), None)
    assert out.level == "healthy"
    assert out.unknown == (Unknown("rdma-errors/symbol_error", BACKWARDS),)
    clock.now += 5
    assert signals.observe(counters(symbol_error=5), None).level == "healthy"


def test_no_rdma_counters_is_unknown_once() -> None:
    signals, _ = nic()
    none = dataclasses.replace(WELL, counters=())
    assert Unknown("rdma-errors", NOT_OFFERED) in signals.observe(none, None).unknown
    assert signals.observe(none, None).unknown == ()


def test_link_flaps_more_than_two_changes_in_ten_minutes_while_up() -> None:
    signals, clock = nic()
    start = clock.now
    signals.observe(WELL, None)
    clock.now += 100
    up = dataclasses.replace(WELL, carrier_changes=3)  # one flap: down and up
    assert signals.observe(up, None).level == "healthy"
    clock.now += 100
    down = dataclasses.replace(WELL, carrier_changes=4, up=False)
    assert signals.observe(down, None).level == "healthy"  # down is Unhealthy elsewhere
    clock.now += 5
    out = signals.observe(dataclasses.replace(WELL, carrier_changes=5), None)
    assert out.level == "degraded"
    assert out.message == "ens1np0 link changed 4 times in the last 10 minutes"
    # The changes leave the ten-minute window, then the hold runs.
    steady = dataclasses.replace(WELL, carrier_changes=5)
    clock.now = start + 599  # the first change is still within the window
    assert signals.observe(steady, None).signals[0].held is False
    clock.now += HOLD_S - 1
    assert signals.observe(steady, None).level == "degraded"
    clock.now += 1
    assert signals.observe(steady, None).level == "healthy"


@pytest.mark.parametrize(
    ("reading", "reason"),
    [
        pytest.param(dataclasses.replace(WELL, carrier_changes=None), NOT_OFFERED, id="absent"),
        pytest.param(dataclasses.replace(WELL, up=None), NOT_OFFERED, id="state-unknown"),
    ],
)
def test_link_flaps_unknown(reading: NicReading, reason: str) -> None:
    signals, _ = nic()
    out = signals.observe(reading, None)
    assert out.level == "healthy"
    assert Unknown("link-flaps", reason) in out.unknown


def test_carrier_changes_going_backwards_is_unknown_not_degraded() -> None:
    signals, clock = nic()
    signals.observe(dataclasses.replace(WELL, carrier_changes=50), None)
    clock.now += 5
    out = signals.observe(dataclasses.replace(WELL, carrier_changes=1), None)
    assert out.level == "healthy"
    assert Unknown("link-flaps", BACKWARDS) in out.unknown


def test_new_limits_apply_from_the_next_probe() -> None:
    signals, clock = nic(limit=10)
    signals.observe(WELL, None)
    clock.now += 5
    assert signals.observe(counters(symbol_error=5), None).level == "healthy"
    signals.apply(Limits(hold_s=5, nic_speed_mbps=0, rdma_errors_per_minute=3))
    clock.now += 5
    assert signals.observe(counters(symbol_error=6), None).level == "degraded"  # +6 > 3
    clock.now += 60
    signals.observe(counters(symbol_error=6), None)
    clock.now += 5
    assert signals.observe(counters(symbol_error=6), None).level == "healthy"  # 5 s hold
