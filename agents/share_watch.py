"""DRA mode, GPU shares: once a GPU probe period, the processes NVML lists on each shared
GPU (read off the event loop), the pods they run in (their cgroups), and the pods each
share's claim is reserved for (read from the API server when first seen, and again when
an unknown pod turns up on its GPU). It keeps each pod's use beside its share's limit
for the metrics, and gives a pod over its share a GPUShareExceeded Event, once per
episode (docs/observability.md)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import structlog

from agents.dra.claim_checkpoint import PreparedClaim
from agents.dra.claims import Claim
from agents.dra.driver import ClaimRef, ReadClaim
from agents.errors import AgentError, BackendError
from agents.hw.nvml import GpuProcesses
from agents.hw.procfs import Procfs
from agents.hw.signal_probes import SignalProbes
from agents.share_usage import (
    Episodes,
    Placed,
    Share,
    ShareCollector,
    ShareUse,
    exceeded_message,
    shares_of,
    strangers,
    uses_of,
)
from agents.share_users import ServerUsers, server_users, waiting_message

if TYPE_CHECKING:
    from agents.backends import Backends
    from agents.cluster.pod_events import PodEvents
    from agents.config import Config
    from agents.metrics import Metrics

log = structlog.get_logger(__name__)

EXCEEDED = "GPUShareExceeded"
WAITS_FOR_USER = "GPUShareWaitsForUser"
USERS_EVERY = 5  # the MPS servers' users are looked at once in this many rounds
CLAIM_RETRY_S = 10.0  # a claim whose read failed is asked again after this long


class ShareWatch:
    """Used from the event loop; `uses` is the last round's answer."""

    def __init__(
        self,
        prepared: Callable[[], Mapping[str, PreparedClaim]],
        nvml: GpuProcesses,
        procfs: Procfs,
        read_claim: ReadClaim,
        *,
        events: PodEvents | None,
        period_s: float,
        users: ServerUsers | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._prepared = prepared
        self._nvml = nvml
        self._procfs = procfs
        self._read_claim = read_claim
        self._events = events
        self._period_s = period_s
        self._clock = clock
        self._probes = SignalProbes(self._placed, "nvml-processes")
        self._pods: dict[str, dict[str, str]] = {}  # claim UID -> pod UID -> pod name
        self._asked: dict[str, set[str]] = {}  # claim UID -> unknown pods it was read for
        self._failed: dict[str, float] = {}  # claim UID -> when its read last failed
        self._unreadable: set[str] = set()  # GPUs whose processes NVML does not give now
        self._foreign_pids = False  # NVML's PIDs were not in this /proc (said once)
        self._episodes = Episodes()
        self._users = users  # who waits behind another user's MPS server
        self.uses: tuple[ShareUse, ...] = ()

    async def run(self) -> None:
        """A round every period until cancelled, and the Events' sender beside it."""
        try:
            async with asyncio.TaskGroup() as group:
                if self._events is not None:
                    group.create_task(_never_failing(self._events.run))
                while True:
                    began = self._clock()
                    try:
                        await self.round()
                    except Exception:  # a bug: the agent serves on without these series
                        log.exception("gpu_share_round_failed")
                    await asyncio.sleep(max(0.0, self._period_s - (self._clock() - began)))
        finally:
            self._probes.close()
            if self._users is not None:
                self._users.close()

    async def round(self) -> None:
        shares = shares_of(self._prepared())
        gpus = sorted({s.device for s in shares})
        placed = await self._probes.readings(gpus, self._period_s) if gpus else {}
        await self._learn(shares, placed)
        self.uses = tuple(uses_of(shares, placed, self._pods))
        for use in self._episodes.begun(self.uses):
            log.warning(
                "gpu_share_exceeded",
                pod=f"{use.share.namespace}/{use.pod}",
                gpu=use.share.device,
                claim=use.share.claim,
                used_bytes=use.used_bytes,
                limit_bytes=use.share.limit_bytes,
            )
            self._tell(use.share.namespace, use.pod, use.pod_uid, EXCEEDED, exceeded_message(use))
        if self._users is not None:
            await self._waiting(shares)

    async def _waiting(self, shares: Sequence[Share]) -> None:
        """Tell each pod that began waiting behind another user's MPS server."""
        assert self._users is not None
        pods = {
            uid: (share.namespace, name)
            for share in shares
            for uid, name in self._pods.get(share.claim_uid, {}).items()
        }
        for wait in await self._users.begun(pods, self._period_s):
            namespace, pod = pods[wait.pod_uid]
            log.warning(
                "gpu_share_waits_for_user",
                pod=f"{namespace}/{pod}",
                uid=wait.uid,
                server_uid=wait.server_uid,
            )
            message = waiting_message(namespace, pod, wait)
            self._tell(namespace, pod, wait.pod_uid, WAITS_FOR_USER, message)

    def _tell(self, namespace: str, pod: str, pod_uid: str, reason: str, message: str) -> None:
        if self._events is not None:
            from agents.cluster.pod_events import PodEvent

            self._events.post(PodEvent(namespace, pod, pod_uid, reason, message))

    def _placed(self, uuid: str) -> Placed:
        """Blocking, in the probes' worker thread: the GPU's processes and their pods."""
        try:
            processes = self._nvml.processes(uuid)
        except BackendError as exc:
            if uuid not in self._unreadable:
                self._unreadable.add(uuid)
                log.warning(
                    "gpu_processes_unreadable",
                    gpu=uuid,
                    error=str(exc),
                    effect="no memory in use for the pods of its shares until NVML answers",
                )
            raise
        if uuid in self._unreadable:
            self._unreadable.discard(uuid)
            log.info("gpu_processes_readable", gpu=uuid)
        placed = tuple((p, self._procfs.pod(p.pid)) for p in processes)
        if (
            not self._foreign_pids
            and placed
            and not any(self._procfs.has(p.pid) for p in processes)
        ):
            self._foreign_pids = True
            log.warning(
                "gpu_processes_not_in_proc",
                gpu=uuid,
                proc=str(self._procfs.root),
                effect="pods are not told apart: the agent needs the host's PID namespace "
                "(hostPID: true)",
            )
        return placed

    async def _learn(self, shares: Sequence[Share], placed: Mapping[str, Placed]) -> None:
        """Read the claims not read yet, and those an unknown pod runs beside."""
        claims = {s.claim_uid: s for s in shares}
        for gone in set(self._pods) - set(claims):  # unprepared
            self._pods.pop(gone, None)
            self._asked.pop(gone, None)
        unknown = strangers(shares, placed, self._pods)
        for uid in set(self._asked) - set(unknown):
            del self._asked[uid]
        now = self._clock()
        wanted = [
            share
            for uid, share in claims.items()
            if (uid not in self._pods or unknown.get(uid, set()) - self._asked.get(uid, set()))
            and now - self._failed.get(uid, -CLAIM_RETRY_S) >= CLAIM_RETRY_S
        ]
        reads = await asyncio.gather(*(self._read(s) for s in wanted))
        for share, claim in zip(wanted, reads, strict=True):
            uid = share.claim_uid
            self._asked[uid] = self._asked.get(uid, set()) | unknown.get(uid, set())
            if claim is None:
                self._failed[uid] = now
                continue
            self._failed.pop(uid, None)
            self._pods[uid] = {p.uid: p.name for p in claim.reserved_for if p.uid and p.name}

    async def _read(self, share: Share) -> Claim | None:
        """The claim (its reservedFor), or None (logged) when it cannot be read now."""
        try:
            return await self._read_claim(ClaimRef(share.namespace, share.claim_uid, share.claim))
        except AgentError as exc:
            log.warning(
                "gpu_share_claim_unread",
                claim=f"{share.namespace}/{share.claim}",
                error=str(exc),
                effect=f"its pods' GPU memory is not shown; asked again in {CLAIM_RETRY_S:g} s",
            )
            return None


async def _never_failing(run: Callable[[], Awaitable[None]]) -> None:
    """The Events are optional: a failure of their sender is logged, the agent goes on."""
    try:
        await run()
    except Exception:
        log.exception("pod_events_failed", effect="no GPUShareExceeded Events")


async def _nothing() -> None:
    """The share series need no refresh at a scrape: each round sets them."""


def share_watch(
    runtime: object,
    serve: object,
    backends: Backends,
    period_s: float,
    *,
    metrics: Metrics | None = None,
    config: Config | None = None,
) -> ShareWatch | None:
    """The watch of the GPU driver's shares, where the agent serves through DRA and its
    NVML lists processes (with its series in `metrics`); None otherwise."""
    from agents.cluster.pod_events import PodEvents
    from agents.dra.runtime import DraRuntime
    from agents.dra.wiring import DraServe
    from agents.gpu.dra import DRIVER

    nvml = backends.nvml
    if not (
        isinstance(runtime, DraRuntime)
        and isinstance(serve, DraServe)
        and isinstance(nvml, GpuProcesses)
    ):
        return None

    def prepared() -> Mapping[str, PreparedClaim]:
        driver = runtime.drivers.get(DRIVER)
        return driver.prepared if driver is not None else {}

    events = PodEvents(serve.settings.node, serve.claims.client)
    procfs = Procfs(backends.proc_root)
    users = server_users(backends, config, procfs, USERS_EVERY * period_s)
    watch = ShareWatch(
        prepared, nvml, procfs, serve.claims.read, events=events, period_s=period_s, users=users
    )
    if metrics is not None:
        metrics.add(ShareCollector(lambda: watch.uses), _nothing)
    return watch
