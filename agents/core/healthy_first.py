"""Degraded devices last: the preferred allocation offers a Degraded device only where
the request cannot be met from Healthy ones, whatever the pairing or distance."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from agents.core.device import Device
from agents.core.health import Grade


def healthy_first(
    available: Sequence[str], must_include: Sequence[str], size: int, degraded: Collection[str]
) -> tuple[list[str], list[str]]:
    """(available, must_include) for the usual choice: without the Degraded devices where
    the Healthy ones (and `must_include`) are enough; else with every Healthy one fixed,
    so that the choice adds Degraded devices only for what is missing."""
    if not degraded:
        return list(available), list(must_include)
    must = set(must_include)
    healthy = [d for d in available if d not in degraded or d in must]
    if len(must.union(healthy)) >= size:
        return healthy, list(must_include)
    fixed = list(dict.fromkeys([*must_include, *(d for d in available if d not in degraded)]))
    return list(available), fixed


def graded(
    device_id: str, grade: Grade, numa: int | None, *, degraded_unhealthy: bool = False
) -> Device:
    """The device as advertised at `grade`: a Degraded device is Healthy to the kubelet
    (`health.degraded.report: healthy`) unless `degraded_unhealthy`."""
    degraded = grade is Grade.DEGRADED
    healthy = grade is Grade.HEALTHY or (degraded and not degraded_unhealthy)
    return Device(device_id, healthy, numa, degraded)
