"""The one path of a device's health change: the log line, the metrics count and the
cluster reporter, once per resource that holds the device. Families publish what they
evaluated; this decides what changed."""

from __future__ import annotations

from collections.abc import Callable, Iterable

import structlog

from agents.core.health import DeviceHealth, Grade
from agents.kernel.telemetry import NoTelemetry, Telemetry

log = structlog.get_logger(__name__)


class HealthFanout:
    """Remembers each (resource, device)'s last health; a device first seen counts as
    having been Healthy, so one that starts Unhealthy is told like any other fault.
    Used on the event loop only; never blocks."""

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
            was = Grade.HEALTHY if before is None else before.grade
            same = before is not None and state.cause == before.cause
            if was is not state.grade:
                self._telemetry.health_event(state)
            elif state.cause is None or not state.cause.news or same:
                continue  # no news: Healthy still, recovering, or the same fault again
            self._tell(state)

    def _tell(self, state: DeviceHealth) -> None:
        where = {"resource": state.resource, "device": state.device_id, "where": state.where}
        if state.cause is None:
            log.info("device_healthy", **where)
        else:
            event = f"device_{state.grade.value.lower()}"  # device_unhealthy, device_degraded
            log.warning(event, **where, reason=state.cause.label)
        if self._reporter is not None:
            self._reporter(state)
