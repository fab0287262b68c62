"""The MPS control daemons of MPS-shared resources, one per resource as NVIDIA's plugin
v0.20 runs them: started (or adopted, when one already answers) before the resource is
served, on GPUs in EXCLUSIVE_PROCESS, each replica limited as NVIDIA's daemon limits it."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import structlog

from agents.core.health import Cause, Taint
from agents.errors import BackendError
from agents.gpu import mps_paths
from agents.gpu.discovery import Gpu
from agents.gpu.plan import ResourcePlan
from agents.hw.mps_control import MpsControl
from agents.hw.nvml import Nvml

log = structlog.get_logger(__name__)

PROBE = "get_default_active_thread_percentage"  # what NVIDIA's plugin asks to see it is up
OLD_CAPABILITY = (7, 5)  # below it an MPS server takes 16 clients, from it 48
OLD_MAX_CLIENTS = 16
EXCLUSIVE = "EXCLUSIVE_PROCESS"  # one context per GPU: the MPS server's, which all clients share
DEFAULT = "DEFAULT"  # the mode a GPU has without MPS


@dataclass(frozen=True)
class MpsDaemonDown(Cause):
    """The resource's MPS control daemon does not answer: its clients cannot connect."""

    resource: str

    @property
    def label(self) -> str:
        return "mps_daemon_down"

    def text(self) -> str:
        return f"MPS control daemon (nvidia-cuda-mps-control) of {self.resource} not running"

    def taint(self, driver: str) -> Taint:
        return Taint(f"{driver}/mps-daemon-down")


@dataclass(frozen=True)
class Daemon:
    resource: str
    pipe_dir: str
    log_dir: str
    commands: tuple[str, ...]  # the per-replica limits, as NVIDIA's daemon sets them
    gpus: frozenset[str]  # the UUIDs of the GPUs it serves
    refused: str = ""  # why NVIDIA's daemon would not start with these replicas


def refusal(plan: ResourcePlan, gpus: Sequence[Gpu]) -> str:
    """Why no daemon serves the plan: more replicas of a GPU older than compute capability
    7.5 than the 16 clients its MPS server takes (NVIDIA's daemon refuses to start)."""
    counts: dict[str, int] = {}
    for unit in plan.units:
        counts[unit.gpu_uuid] = counts.get(unit.gpu_uuid, 0) + 1
    for gpu in gpus:
        cap = gpu.capability()
        n = counts.get(gpu.uuid, 0)
        if cap is not None and cap < OLD_CAPABILITY and n > OLD_MAX_CLIENTS:
            return (
                f"{n} replicas of GPU {gpu.index} (compute capability {gpu.compute_capability}):"
                f" an MPS server below {OLD_CAPABILITY[0]}.{OLD_CAPABILITY[1]} takes at most"
                f" {OLD_MAX_CLIENTS} clients"
            )
    return ""


def limits(plan: ResourcePlan, gpus: Sequence[Gpu]) -> tuple[str, ...]:
    """1/replicas of each GPU's memory (by index, in MiB) and 100/replicas % of its SMs."""
    by_uuid = {g.uuid: g for g in gpus}
    replicas: dict[str, int] = {}
    for unit in plan.units:
        replicas[unit.gpu_uuid] = replicas.get(unit.gpu_uuid, 0) + 1
    commands = [
        f"set_default_device_pinned_mem_limit {by_uuid[u].index} {by_uuid[u].memory_mib // n}M"
        for u, n in replicas.items()
        if by_uuid[u].memory_mib
    ]
    if replicas:  # NVIDIA's: replicas per GPU from the resource's totals
        per_gpu = len(plan.units) // len(replicas)
        commands.append(f"set_default_active_thread_percentage {100 // per_gpu}")
    return tuple(commands)


class MpsDaemons:
    """Blocking calls all; `root` is flags.mpsRoot as the agent sees it, `nvml` initialised
    while the daemons may be started."""

    def __init__(
        self,
        control: MpsControl | None,
        root: str,
        plans: Sequence[ResourcePlan],
        gpus: Sequence[Gpu],
        nvml: Nvml,
    ) -> None:
        self.control = control
        self._nvml = nvml
        self._shm = mps_paths.shm_dir(root)
        self.daemons = tuple(
            Daemon(
                p.name,
                mps_paths.pipe_dir(root, p.name),
                mps_paths.log_dir(root, p.name),
                limits(p, gpus),
                frozenset(u.gpu_uuid for u in p.units),
                refusal(p, gpus),
            )
            for p in plans
            if p.mps
        )
        self.down: set[str] = set()  # resources whose daemon did not answer last

    def ensure(self) -> None:
        """Adopt each daemon that answers, start the others; one that will not start is
        down (its devices Unhealthy), not an error."""
        for daemon in self.daemons:
            self._ensure(daemon)

    def _ensure(self, daemon: Daemon) -> None:
        if daemon.refused:
            self._unavailable(daemon, daemon.refused)
            return
        if self._answers(daemon):
            log.info("mps_daemon_adopted", resource=daemon.resource, pipe_dir=daemon.pipe_dir)
            self.down.discard(daemon.resource)
            return
        if self.control is None:
            self._unavailable(daemon, "no " + "nvidia-cuda-mps-control")
            return
        try:
            self._exclusive(daemon)
            os.makedirs(self._shm, exist_ok=True)  # the clients' /dev/shm
            self.control.start(daemon.pipe_dir, daemon.log_dir)
            for command in daemon.commands:
                self.control.send(daemon.pipe_dir, daemon.log_dir, command)
        except (BackendError, OSError) as exc:
            self._unavailable(daemon, str(exc))
            return
        log.info(
            "mps_daemon_started",
            resource=daemon.resource,
            pipe_dir=daemon.pipe_dir,
            limits=list(daemon.commands),
        )
        self.down.discard(daemon.resource)

    def _unavailable(self, daemon: Daemon, reason: str) -> None:
        """Its daemon will not start: logged once until it does; its replicas Unhealthy."""
        if daemon.resource not in self.down:
            log.warning(
                "mps_daemon_unavailable",
                resource=daemon.resource,
                reason=reason,
                effect="its replicas are Unhealthy until the daemon starts (tried again)",
            )
        self.down.add(daemon.resource)

    def _exclusive(self, daemon: Daemon) -> None:
        """Its GPUs in EXCLUSIVE_PROCESS before the start, as NVIDIA's daemon sets them: a
        GPU it cannot set is not served by MPS (NVIDIA's daemon does not start either).
        Never set back here: the daemon outlives the agent and keeps serving them."""
        for uuid in sorted(daemon.gpus):
            self._nvml.set_compute_mode(uuid, EXCLUSIVE)

    def gpus(self) -> frozenset[str]:
        """The GPUs its daemons serve."""
        return frozenset(u for d in self.daemons if not d.refused for u in d.gpus)

    def retired_by(self, newer: MpsDaemons | None) -> list[Daemon]:
        """This config's daemons that `newer` (a reload's) does not run."""
        kept = set() if newer is None else {d.pipe_dir for d in newer.daemons}
        return [d for d in self.daemons if d.pipe_dir not in kept and not d.refused]

    def probe(self) -> bool:
        """Ask each daemon whether it runs; restart the ones down. True if any changed."""
        before = set(self.down)
        for daemon in self.daemons:
            if not daemon.refused and self._answers(daemon):
                self.down.discard(daemon.resource)
                continue
            if daemon.resource not in before:
                log.warning("mps_daemon_down", resource=daemon.resource, pipe_dir=daemon.pipe_dir)
            self.down.add(daemon.resource)
        return self.down != before

    def restart(self) -> bool:
        """Start again each daemon that is down; True if any came back."""
        before = set(self.down)
        for daemon in self.daemons:
            if daemon.resource in before:
                self._ensure(daemon)
        return self.down != before

    def cause(self, uuid: str) -> Cause | None:
        """Why the GPU's replicas are Unhealthy: its daemon down; None when it runs."""
        for daemon in self.daemons:
            if daemon.resource in self.down and uuid in daemon.gpus:
                return MpsDaemonDown(daemon.resource)
        return None

    def _answers(self, daemon: Daemon) -> bool:
        return answers(self.control, daemon.pipe_dir, daemon.log_dir)


def answers(control: MpsControl | None, pipe_dir: str, log_dir: str) -> bool:
    """Blocking. Whether a daemon answers NVIDIA's probe on `pipe_dir`."""
    if control is None:
        return False
    try:
        control.send(pipe_dir, log_dir, PROBE)
    except BackendError:
        return False
    return True


class Watched(Protocol):
    """Daemons watched: MpsDaemons, or DRA shares' one (agents/gpu/share_mps.py)."""

    down: set[str]  # what is served by a daemon that does not answer

    def probe(self) -> bool: ...

    def restart(self) -> bool: ...


async def watch(
    mps: Watched,
    probe_s: float,
    restart_s: float,
    clock: Callable[[], float],
    changed: Callable[[], None],
) -> None:
    """Probe the daemons every `probe_s` (off the loop); one down for `restart_s` is
    started again. `changed` is called on the loop whenever one goes or comes back."""
    down_since: float | None = None
    while True:
        if await asyncio.to_thread(mps.probe):
            changed()
        if not mps.down:
            down_since = None
        elif down_since is None:
            down_since = clock()
        elif clock() - down_since >= restart_s:
            log.info("mps_daemon_restarting", resources=sorted(mps.down))
            if await asyncio.to_thread(mps.restart):
                changed()
            down_since = clock() if mps.down else None
        await asyncio.sleep(probe_s)  # the probe period, a timer
