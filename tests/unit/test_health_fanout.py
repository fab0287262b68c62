"""The one path of health changes: what is news (a grade change, another fault) reaches the
log, the metrics and the reporter; the same fault again and recovering do not."""

from __future__ import annotations

from structlog.testing import capture_logs

from agents.core.health import Cause, DeviceHealth, GpuLost, Holding, Xids
from agents.health import HealthFanout


class Counted:
    """Telemetry that keeps each health event's resource and metrics reason."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def rpc_done(self, resource: str, method: str, seconds: float, code: str) -> None:
        pass

    def allocated(self, resource: str, devices: int) -> None:
        pass

    def registered(self, resource: str) -> None:
        pass

    def health_event(self, change: DeviceHealth) -> None:
        cause = change.cause
        self.events.append((change.resource, "recovered" if cause is None else cause.label))


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
