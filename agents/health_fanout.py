"""The one path of a device's health change: the log line, the metrics and the cluster
reporter, once per resource that holds the device. Families publish what they evaluated;
this decides what changed."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import structlog

from agents.core.health import Cause, DeviceHealth, Grade, signals_of
from agents.kernel.telemetry import NoTelemetry, Telemetry

log = structlog.get_logger(__name__)


class HealthFanout:
    """Remembers each (resource, device)'s last health; a device first seen counts as
    having been Healthy, so one that starts Unhealthy is told like any other fault.
    Measured signals are one fault while their set stays: new figures of the same
    signals reach the metrics, not the log or the cluster. Used on the event loop only;
    never blocks."""

    def __init__(
        self,
        telemetry: Telemetry | None = None,
        reporter: Callable[[DeviceHealth], None] | None = None,
    ) -> None:
        self._telemetry = telemetry or NoTelemetry()
        self._reporter = reporter
        self._known: dict[tuple[str, str], DeviceHealth] = {}

    def publish(self, states: Iterable[DeviceHealth]) -> None:
        for state in states:
            key = state.resource, state.device_id
            before = self._known.get(key)
            self._known[key] = state
            if before != state:
                self._telemetry.device_health(state)  # the figures, even unchanged faults
            was = Grade.HEALTHY if before is None else before.grade
            same = before is not None and _fault(state.cause) == _fault(before.cause)
            if was is not state.grade:
                self._telemetry.health_event(state)
            elif state.cause is None or not state.cause.news or same:
                continue  # no news: Healthy still, recovering, or the same fault again
            self._tell(state)

    def readings(self, resource: str, device: str, values: Mapping[str, float | None]) -> None:
        """One probe's readings of a device, whatever its verdict: to the metrics only."""
        self._telemetry.readings(resource, device, values)

    def xid(self, resource: str, device: str, xid: int) -> None:
        """An XID of a device, whether or not it changes its health: to the metrics only."""
        self._telemetry.xid(resource, device, xid)

    def _tell(self, state: DeviceHealth) -> None:
        where = {"resource": state.resource, "device": state.device_id, "where": state.where}
        if state.cause is None:
            log.info("device_healthy", **where)
        else:
            event = f"device_{state.grade.value.lower()}"  # device_unhealthy, device_degraded
            log.warning(event, **where, reason=state.cause.label)
        if self._reporter is not None:
            self._reporter(state)


def _fault(cause: Cause | None) -> object:
    """What makes a fault the same one: for measured signals their names and grades (a
    PCIe link at x8, then x4, of x16 is one fault), for any other the cause itself."""
    signals = signals_of(cause)
    if signals:
        return frozenset((s.name, s.level) for s in signals)
    return cause
