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


class PendingXids:
    """Per GPU, the critical XIDs delivered whose effect has not cleared.

    NVML cannot tell when an XID's effect ends, so a delivered XID stays pending until the
    GPU is seen lost and later answering again (a reset) or the agent restarts. XIDs in
    `ignored` (application XIDs, disabled ones) are never kept.
    """

    def __init__(self, ignored: frozenset[int] = frozenset()) -> None:
        self._ignored = ignored
        self._pending: dict[str, set[int]] = {}
        self._lost: set[str] = set()

    def deliver(self, uuid: str, xid: int) -> None:
        if xid not in self._ignored:
            self._pending.setdefault(uuid, set()).add(xid)

    def observe(self, uuid: str, lost: bool) -> bool:
        """Record whether the GPU answered; True when it came back from lost (a reset)."""
        if lost:
            self._lost.add(uuid)
            return False
        if uuid not in self._lost:
            return False
        self._lost.discard(uuid)
        self._pending.pop(uuid, None)
        return True

    def pending(self, uuid: str) -> frozenset[int]:
        return frozenset(self._pending.get(uuid, ()))
