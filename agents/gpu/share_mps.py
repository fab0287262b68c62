"""The node's one MPS control daemon for DRA shares (`sharing.shares` with `enforce: mps`)
and the compute mode of the GPUs that hold shares. The daemon is started (or adopted, when
one answers) before the first share is served, with no default limits: each client's come
from its container's environment. A GPU is in EXCLUSIVE_PROCESS (one MPS server, which
all its clients share) while it holds shares, and DEFAULT again when its last share goes.
The agent never stops the daemon: it outlives the agent's restarts and rollouts."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Mapping

import structlog

from agents.core.health import Cause
from agents.errors import BackendError
from agents.gpu.mps import DEFAULT, EXCLUSIVE, MpsDaemonDown, answers
from agents.hw.mps_control import MpsControl
from agents.hw.nvml import Nvml
from agents.hw.nvml_calls import bounded
from agents.kernel.edits import DeviceKey

log = structlog.get_logger(__name__)

SHARES = "gpu.nvidia.com shares"  # what the daemon serves, as its cause names it
HOLD_WAIT_S = 25.0  # a prepare's daemon start and compute modes, well within its 45 s


class ShareDaemon:
    """Blocking calls all, made from worker threads, one at a time."""

    def __init__(
        self, control: MpsControl, pipe_dir: str, log_dir: str, shm_dir: str, nvml: Nvml
    ) -> None:
        self._control = control
        self._nvml = nvml
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self._shm = shm_dir
        self.down: set[str] = set()  # {SHARES} while the daemon does not answer
        self.holding: frozenset[str] = frozenset()  # UUIDs of the GPUs that hold shares
        self._lock = threading.Lock()

    def ensure(self) -> str | None:
        """Adopt the daemon that answers, else start it; why it does not run, or None."""
        with self._lock:
            return self._ensure()

    def _ensure(self) -> str | None:
        if self._answers():
            log.info("mps_daemon_adopted", resource=SHARES, pipe_dir=self.pipe_dir)
            self.down.clear()
            return None
        try:
            for directory in (self.pipe_dir, self.log_dir, self._shm):
                os.makedirs(directory, exist_ok=True)
            self._control.start(self.pipe_dir, self.log_dir)
        except (BackendError, OSError) as exc:
            self.down.add(SHARES)
            return str(exc)
        log.info("mps_daemon_started", resource=SHARES, pipe_dir=self.pipe_dir)
        self.down.clear()
        return None

    def probe(self) -> bool:
        """Ask the daemon whether it runs; True if that changed."""
        with self._lock:
            was = bool(self.down)
            if self._answers():
                self.down.clear()
            else:
                if not was:
                    log.warning("mps_daemon_down", resource=SHARES, pipe_dir=self.pipe_dir)
                self.down.add(SHARES)
            return bool(self.down) != was

    def restart(self) -> bool:
        """Start the daemon again if it is down; True if it came back."""
        with self._lock:
            if not self.down:
                return False
            why = self._ensure()
            if why is not None:
                log.warning(
                    "mps_daemon_unavailable",
                    resource=SHARES,
                    reason=why,
                    effect="the GPUs holding shares stay Unhealthy (tried again)",
                )
            return why is None

    def cause(self, uuid: str) -> Cause | None:
        """Why the GPU is Unhealthy: it holds shares and their daemon is down."""
        return MpsDaemonDown(SHARES) if self.down and uuid in self.holding else None

    def hold(self, held: frozenset[str], fresh: frozenset[str]) -> None:
        """The GPUs (UUIDs) that hold shares now, `fresh` about to serve a new one: the
        daemon started if it is down and the joining GPUs set EXCLUSIVE_PROCESS, or
        BackendError with every change of this call undone; the GPUs that hold none any
        more set back to DEFAULT (a failure there is logged)."""
        with self._lock:
            if fresh and self.down and (why := self._ensure()) is not None:
                raise BackendError(f"no MPS control daemon runs at {self.pipe_dir}: {why}")
            changed: dict[str, str] = {}  # GPU -> its mode before this call
            for uuid in sorted(held - self.holding):
                try:
                    before = self._set(uuid, EXCLUSIVE)
                except BackendError as exc:
                    if uuid not in fresh:  # held already (restored): the others go on
                        log.warning("gpu_compute_mode_unset", gpu=uuid, error=str(exc))
                        continue
                    for undo, mode in changed.items():
                        self._set_logged(undo, mode)
                    raise BackendError(
                        f"GPU {uuid}: compute mode {EXCLUSIVE} not set: {exc}"
                    ) from exc
                if before is not None:
                    changed[uuid] = before
            for uuid in sorted(self.holding - held):
                self._set_logged(uuid, DEFAULT)
            self.holding = held

    def _set(self, uuid: str, mode: str) -> str | None:
        """The GPU set to `mode`; the mode it had, or None when it had that one."""
        before = self._nvml.compute_mode(uuid)
        if before == mode:
            return None
        self._nvml.set_compute_mode(uuid, mode)
        log.info("gpu_compute_mode_set", gpu=uuid, mode=mode, was=before)
        return before

    def _set_logged(self, uuid: str, mode: str) -> None:
        try:
            self._set(uuid, mode)
        except BackendError as exc:
            log.warning("gpu_compute_mode_unset", gpu=uuid, mode=mode, error=str(exc))

    def _answers(self) -> bool:
        return answers(self._control, self.pipe_dir, self.log_dir)


async def hold_shares(
    daemon: ShareDaemon,
    gpus: Mapping[DeviceKey, str],
    held: frozenset[DeviceKey],
    fresh: frozenset[DeviceKey],
) -> None:
    """`daemon.hold` of the devices' GPUs (`gpus`: device -> GPU UUID), off the loop."""
    call = functools.partial(
        daemon.hold,
        frozenset(gpus[k] for k in held if k in gpus),
        frozenset(gpus[k] for k in fresh if k in gpus),
    )
    await bounded(call, HOLD_WAIT_S, "compute mode")
