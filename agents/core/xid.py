"""XID policy: which XID errors make a GPU unhealthy and why, for health reports."""

from __future__ import annotations

# Raised by faults in the user's application (illegal address, MMU fault, reset
# channel, preemptive cleanup, video processor exception, ...), not by the GPU:
# the next container on the same GPU is fine, so they never mark it unhealthy.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})


def is_critical(xid: int, disabled: frozenset[int]) -> bool:
    """Whether this XID marks a GPU unhealthy; `disabled` adds to the application XIDs."""
    return xid not in APPLICATION_XIDS and xid not in disabled


def gpu_healthy(lost: bool, pending_xids: frozenset[int], disabled: frozenset[int]) -> bool:
    """Healthy unless it fell off the bus or holds a critical XID."""
    return unhealthy_reason(lost, pending_xids, disabled) is None


def unhealthy_reason(
    lost: bool, pending_xids: frozenset[int], disabled: frozenset[int]
) -> str | None:
    """Why a GPU is unhealthy, for logs: "lost", "xid=79" or "xid=48,79"; None if healthy."""
    if lost:
        return "lost"
    critical = sorted(x for x in pending_xids if is_critical(x, disabled))
    if not critical:
        return None
    return "xid=" + ",".join(str(x) for x in critical)
