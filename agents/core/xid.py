"""The GPU health model, one for every NVML backend: which XIDs and NVML answers make a
GPU Unhealthy, and which real signals make it Healthy again."""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.core.health import Cause, GpuLost, Holding, Xids

# Raised by faults in the user's application (illegal address, MMU fault, reset
# channel, preemptive cleanup, video processor exception, context switch timeout),
# not by the GPU: the next container on the same GPU is fine, so they never mark it
# unhealthy. The same list as NVIDIA's device plugin.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

HOLD_S = 3.0  # NVML must answer normally this long before a GPU it failed on is Healthy


def is_critical(xid: int, disabled: frozenset[int]) -> bool:
    """Whether this XID marks a GPU unhealthy; `disabled` adds to the application XIDs."""
    return xid not in APPLICATION_XIDS and xid not in disabled


@dataclass(frozen=True)
class HealthPolicy:
    disabled_xids: frozenset[int] = frozenset()
    xid_recovery_s: float | None = None  # None: a critical XID holds until a reset/restart
    hold_s: float = HOLD_S


@dataclass
class _Gpu:
    xids: dict[int, float] = field(default_factory=dict)  # critical XID -> last delivered
    failing: Cause | None = None  # why NVML's last answer was not normal
    answering_since: float | None = None  # first normal answer after a failure
    lost: bool = False  # seen lost since it last answered normally


class GpuHealth:
    """Per GPU, from NVML's answers and XID events (all timed by the caller's clock):

    - Unhealthy while NVML answers lost, fails, or hangs, and for `hold_s` after it
      answers normally again;
    - Unhealthy from a critical XID until the GPU is lost and answers again (a reset),
      or, with `xid_recovery_s`, NVML has answered normally that long since the XID;
      otherwise until the agent restarts.
    """

    def __init__(self, policy: HealthPolicy) -> None:
        self.policy = policy
        self._gpus: dict[str, _Gpu] = {}

    def take_over(self, earlier: GpuHealth) -> None:
        """Go on from what `earlier` knew of each GPU (its family rebuilt on a reload): a
        GPU it held Unhealthy stays so; this policy applies from now on."""
        self._gpus = earlier._gpus

    def xid(self, uuid: str, xid: int, now: float) -> bool:
        """Record an XID event; True when it is critical and was not pending already."""
        if not is_critical(xid, self.policy.disabled_xids):
            return False
        xids = self._gpu(uuid).xids
        new = xid not in xids
        xids[xid] = now
        return new

    def answered(self, uuid: str, now: float, failing: Cause | None) -> None:
        """Record NVML's answer: failing=None for a normal one, else why it was not."""
        gpu = self._gpu(uuid)
        if failing is not None:
            gpu.failing, gpu.answering_since = failing, None
            gpu.lost = gpu.lost or isinstance(failing, GpuLost)
            return
        if gpu.failing is not None:
            gpu.failing, gpu.answering_since = None, now
        if gpu.lost:  # lost, then answering again: the GPU was reset
            gpu.lost = False
            gpu.xids.clear()

    def cause(self, uuid: str, now: float) -> Cause | None:
        """Why the GPU is Unhealthy now (lost, critical XIDs, an NVML error, hung, holding);
        None when it is Healthy."""
        gpu = self._gpu(uuid)
        if gpu.failing is not None:
            return gpu.failing
        recovery = self.policy.xid_recovery_s
        if gpu.xids and recovery is not None:
            quiet_since = max([*gpu.xids.values(), gpu.answering_since or 0.0])
            if now - quiet_since >= recovery:
                gpu.xids.clear()
        if gpu.xids:
            return Xids(tuple(sorted(gpu.xids)))
        since = gpu.answering_since
        if since is not None and now - since < self.policy.hold_s:
            return Holding()
        return None

    def _gpu(self, uuid: str) -> _Gpu:
        return self._gpus.setdefault(uuid, _Gpu())
