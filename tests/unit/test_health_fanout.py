"""The one path of health changes: what is news (a grade change, another fault) reaches the
log, the metrics and the reporter; the same fault again and recovering do not. Degraded
devices: a change of the signal set is news, new figures of the same signals only reach
the metrics."""

from __future__ import annotations

from structlog.testing import capture_logs

from agents.core.degraded import SignalVerdict
from agents.core.health import (
    Cause,
    DeviceHealth,
    GpuLost,
    Grade,
    Holding,
    Signal,
    Signals,
    Xids,
    signal_cause,
)
from agents.health_fanout import HealthFanout
from agents.kernel.telemetry import NoTelemetry


class Counted(NoTelemetry):
    """Telemetry that keeps each health event's resource and metrics reason."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []
        self.states: list[DeviceHealth] = []

    def health_event(self, change: DeviceHealth) -> None:
        cause = change.cause
        self.events.append((change.resource, "recovered" if cause is None else cause.label))

    def device_health(self, state: DeviceHealth) -> None:
        self.states.append(state)


def gpu(cause: Cause | None = None) -> DeviceHealth:
    return DeviceHealth("nvidia.com/gpu", "GPU-0", "GPU 0", cause)


def test_only_news_is_logged_counted_and_reported() -> None:
    telemetry, told = Counted(), list[DeviceHealth]()
    fanout = HealthFanout(telemetry, told.append)
    steps = [gpu(), gpu(Xids((79,))), gpu(Xids((79,))), gpu(GpuLost()), gpu(Holding()), gpu()]
    with capture_logs() as logs:
        for state in steps:
            fanout.publish([state])
    assert [(e["event"], e.get("reason")) for e in logs] == [
        ("device_unhealthy", "xid=79"),
        ("device_unhealthy", "lost"),  # another fault of a device already Unhealthy
        ("device_healthy", None),
    ]
    assert telemetry.events == [("nvidia.com/gpu", "xid=79"), ("nvidia.com/gpu", "recovered")]
    assert [s.cause for s in told] == [Xids((79,)), GpuLost(), None]


def test_a_device_first_seen_unhealthy_is_told_like_any_fault() -> None:
    telemetry, told = Counted(), list[DeviceHealth]()
    HealthFanout(telemetry, told.append).publish([gpu(GpuLost())])
    assert telemetry.events == [("nvidia.com/gpu", "lost")]
    assert told == [gpu(GpuLost())]


X8 = Signal("pcie-width", "PCIe link x8 of x16", (("width", 8), ("maxWidth", 16)))
X4 = Signal("pcie-width", "PCIe link x4 of x16", (("width", 4), ("maxWidth", 16)))
LINKS = Signal("nvlink-down", "NVLink 2 of 18 links down", (("down", 2), ("links", 18)))


def told_of(steps: list[DeviceHealth]) -> tuple[list[tuple[str, str]], Counted, list[str]]:
    """(event, cause text) as the reporter is told, the telemetry, and the log events."""
    telemetry, told = Counted(), list[DeviceHealth]()
    fanout = HealthFanout(telemetry, told.append)
    with capture_logs() as logs:
        for state in steps:
            fanout.publish([state])
    said = [(s.grade.value, s.cause.text() if s.cause else "") for s in told]
    return said, telemetry, [e["event"] for e in logs]


def test_degraded_then_unhealthy_then_healthy_is_told_at_each_grade() -> None:
    said, telemetry, logged = told_of([gpu(), gpu(X8), gpu(Xids((79,))), gpu()])
    assert said == [
        ("Degraded", "PCIe link x8 of x16"),
        ("Unhealthy", "XID 79 (fell off the bus)"),
        ("Healthy", ""),
    ]
    assert logged == ["device_degraded", "device_unhealthy", "device_healthy"]
    assert [reason for _, reason in telemetry.events] == ["pcie-width", "xid=79", "recovered"]


def test_degraded_then_healthy_is_told_once_each() -> None:
    said, _, _ = told_of([gpu(X8), gpu(X8), gpu()])
    assert said == [("Degraded", "PCIe link x8 of x16"), ("Healthy", "")]


def test_another_signal_while_degraded_is_news_without_a_grade_change() -> None:
    both = Signals((X8, LINKS))
    said, telemetry, _ = told_of([gpu(X8), gpu(both), gpu(LINKS)])
    assert said == [
        ("Degraded", "PCIe link x8 of x16"),
        ("Degraded", "PCIe link x8 of x16; NVLink 2 of 18 links down"),
        ("Degraded", "NVLink 2 of 18 links down"),
    ]
    assert telemetry.events == [("nvidia.com/gpu", "pcie-width")]  # one grade change


def test_new_figures_of_the_same_signal_reach_only_the_metrics() -> None:
    said, telemetry, logged = told_of([gpu(X8), gpu(X4), gpu(X4)])
    assert said == [("Degraded", "PCIe link x8 of x16")]
    assert logged == ["device_degraded"]
    assert [s.cause for s in telemetry.states] == [X8, X4]  # the repeat is no change


def test_a_signal_turning_unhealthy_is_told_as_unhealthy() -> None:
    failed = Signal("row-remap-failed", "row remapping failed", (), Grade.UNHEALTHY)
    pending = Signal("row-remap-pending", "row remap pending")
    said, _, _ = told_of([gpu(pending), gpu(Signals((failed, pending)))])
    assert said == [("Degraded", "row remap pending"), ("Unhealthy", "row remapping failed")]


def test_verdicts_become_one_signal_or_several() -> None:
    width = SignalVerdict("pcie-width", "degraded", "PCIe link x8 of x16", X8.measured)
    failed = SignalVerdict("row-remap-failed", "unhealthy", "row remapping failed")
    assert signal_cause([]) is None
    assert signal_cause([width]) == X8
    both = signal_cause([width, failed])
    assert isinstance(both, Signals) and both.grade is Grade.UNHEALTHY
    assert both.taint("nvidia.com").value == "row-remap-failed"
    assert both.label == "pcie-width,row-remap-failed"
    assert both.figures() == {"pcie-width.width": 8, "pcie-width.maxWidth": 16}
