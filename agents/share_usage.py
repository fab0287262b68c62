"""Each pod's GPU memory in use beside its share's limit, as values: the prepared shares
of GPUs, the processes on them mapped to pods, and the pods each claim is reserved for,
joined; and which pods are over their share, episode by episode."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from agents.core.pod_cgroup import PodCgroup
from agents.core.quantity import quantity
from agents.dra.claim_checkpoint import PreparedClaim
from agents.gpu.dra import MEMORY
from agents.hw.nvml import GpuProcess

if TYPE_CHECKING:
    from agents.exposition import Family

# A GPU's processes, each with the pod it runs in (None: outside every pod, or gone).
Placed = Sequence[tuple[GpuProcess, PodCgroup | None]]


@dataclass(frozen=True)
class Share:
    """What one claim holds of one GPU: its shares there, their memory together."""

    claim_uid: str
    namespace: str
    claim: str
    resource: str
    device: str  # the family's device ID: the GPU's UUID
    limit_bytes: int


@dataclass(frozen=True)
class ShareUse:
    """One pod of a claim, on one GPU the claim shares: what it uses (None: NVML did not
    answer for the GPU this round) of the share's limit."""

    share: Share
    pod: str
    pod_uid: str
    used_bytes: int | None

    @property
    def over(self) -> bool:
        return self.used_bytes is not None and self.used_bytes > self.share.limit_bytes


def shares_of(prepared: Mapping[str, PreparedClaim]) -> list[Share]:
    """The shares among a driver's prepared claims (by claim UID), one per claim and GPU;
    a share that names no memory limits nothing and is left out."""
    totals: dict[tuple[str, str, str], Fraction] = {}
    for uid, claim in prepared.items():
        for device in claim.devices:
            amount = quantity(device.consumed.get(MEMORY, "")) if device.share_id else None
            if isinstance(amount, Fraction) and amount > 0:
                key = (uid, device.resource, device.device_id)
                totals[key] = totals.get(key, Fraction(0)) + amount
    return [
        Share(uid, prepared[uid].namespace, prepared[uid].name, resource, device, int(total))
        for (uid, resource, device), total in totals.items()
    ]


def uses_of(
    shares: Iterable[Share],
    placed: Mapping[str, Placed],
    pods: Mapping[str, Mapping[str, str]],
) -> list[ShareUse]:
    """Per share and pod of its claim (`pods`: claim UID -> pod UID -> pod name, from
    the claim's reservedFor), the memory of that pod's processes on the share's GPU;
    None for a GPU whose processes are not known (`placed` lacks it)."""
    out: list[ShareUse] = []
    for share in shares:
        on_gpu = placed.get(share.device)
        for pod_uid, pod in sorted(pods.get(share.claim_uid, {}).items()):
            used = None
            if on_gpu is not None:
                used = sum(
                    process.used_bytes or 0
                    for process, where in on_gpu
                    if where is not None and where.pod_uid == pod_uid
                )
            out.append(ShareUse(share, pod, pod_uid, used))
    return out


def strangers(
    shares: Iterable[Share], placed: Mapping[str, Placed], pods: Mapping[str, Mapping[str, str]]
) -> dict[str, set[str]]:
    """Per claim UID, the pods running on one of its shared GPUs that no claim there is
    known to be reserved for: a pod that joined a claim since it was read, or a pod of no
    share at all (a process outside the agent's shares)."""
    by_gpu: dict[str, list[Share]] = {}
    for share in shares:
        by_gpu.setdefault(share.device, []).append(share)
    out: dict[str, set[str]] = {}
    for gpu, here in by_gpu.items():
        known = {uid for s in here for uid in pods.get(s.claim_uid, {})}
        seen = {w.pod_uid for _, w in placed.get(gpu, ()) if w is not None}
        for share in here:
            if seen - known:
                out.setdefault(share.claim_uid, set()).update(seen - known)
    return out


class Episodes:
    """Which pods are over a share now: `begun` tells those that went over since the
    last round (once per episode); a GPU not read this round ends no episode on it."""

    def __init__(self) -> None:
        self._over: set[tuple[str, str, str]] = set()  # (claim UID, GPU, pod UID)

    def begun(self, uses: Iterable[ShareUse]) -> list[ShareUse]:
        now: set[tuple[str, str, str]] = set()
        unread: set[tuple[str, str, str]] = set()
        fresh: list[ShareUse] = []
        for use in uses:
            key = (use.share.claim_uid, use.share.device, use.pod_uid)
            if use.used_bytes is None:
                unread.add(key)
            elif use.over:
                now.add(key)
                if key not in self._over:
                    fresh.append(use)
        self._over = now | (self._over & unread)
        return fresh


def gib(count: int) -> str:
    return f"{count / 2**30:.1f} GiB"


def exceeded_message(use: ShareUse) -> str:
    share = use.share
    return (
        f"Pod {share.namespace}/{use.pod} uses {gib(use.used_bytes or 0)} of GPU "
        f"{share.device}, over the {gib(share.limit_bytes)} its claim {share.claim} holds "
        "there: MPS's limit binds only processes given its variables, and none where "
        "shares are not enforced"
    )


LABELS = ("resource", "device", "namespace", "pod", "claim")


class ShareCollector:
    """node_agent_gpu_share_memory_used_bytes and _limit_bytes, from the last round."""

    def __init__(self, uses: Callable[[], Iterable[ShareUse]]) -> None:
        self._uses = uses

    def collect(self) -> Iterator[Family]:
        from agents.exposition import Family

        used = Family(
            "node_agent_gpu_share_memory_used_bytes",
            "GPU memory the pod's processes use on the GPU of its share, in bytes (NVML)",
            LABELS,
        )
        limit = Family(
            "node_agent_gpu_share_memory_limit_bytes",
            "GPU memory the pod's claim holds of the GPU as a share, in bytes",
            LABELS,
        )
        for use in self._uses():
            s = use.share
            labels = (s.resource, s.device, s.namespace, use.pod, s.claim)
            limit.add(labels, s.limit_bytes)
            if use.used_bytes is not None:  # NVML did not answer: no series, not 0
                used.add(labels, use.used_bytes)
        yield used
        yield limit
