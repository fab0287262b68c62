"""MPS control daemons that a reload no longer wants (a resource no longer shared with
MPS): each is stopped once no client is left on its servers, and its GPUs are set back
to DEFAULT, the mode they had before MPS served them; one whose clients still run (a pod
given a replica before the reload) is left serving them and asked again each probe."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import structlog

from agents.errors import BackendError
from agents.gpu.mps import DEFAULT, Daemon
from agents.hw.mps_control import CLIENT_LIST, SERVER_LIST, MpsControl
from agents.hw.nvml import Nvml

log = structlog.get_logger(__name__)


class MpsRetirement:
    """Blocking calls all. `keep` gives the GPUs that MPS still serves (the new config's
    daemons, GPUs holding shares): never set back."""

    def __init__(
        self,
        control: MpsControl | None,
        nvml: Nvml,
        daemons: Sequence[Daemon],
        keep: Callable[[], frozenset[str]],
    ) -> None:
        self._control = control
        self._nvml = nvml
        self.daemons = list(daemons)
        self._keep = keep
        self._waiting: set[str] = set()  # resources said to wait for their clients

    def step(self) -> None:
        """Stop each retired daemon without clients and set its GPUs back."""
        for daemon in list(self.daemons):
            clients = self._clients(daemon)
            if clients:
                if daemon.resource not in self._waiting:
                    log.info(
                        "mps_daemon_retiring",
                        resource=daemon.resource,
                        clients=clients,
                        effect="stopped once its clients end; its GPUs stay EXCLUSIVE_PROCESS",
                    )
                    self._waiting.add(daemon.resource)
                continue
            self._stop(daemon)
            self.daemons.remove(daemon)

    def _clients(self, daemon: Daemon) -> list[str]:
        """The PIDs of its servers' clients; none where it does not answer (gone)."""
        try:
            servers = self._send(daemon, SERVER_LIST).split()
            return [c for s in servers for c in self._send(daemon, f"{CLIENT_LIST} {s}").split()]
        except BackendError:
            return []

    def _stop(self, daemon: Daemon) -> None:
        try:
            self._send(daemon, "quit")
        except BackendError as exc:  # gone already: its GPUs are set back all the same
            log.info("mps_daemon_gone", resource=daemon.resource, error=str(exc))
        back = sorted(daemon.gpus - self._keep())
        for uuid in back:
            try:
                self._nvml.set_compute_mode(uuid, DEFAULT)
            except BackendError as exc:
                log.warning("gpu_compute_mode_not_reset", gpu=uuid, error=str(exc))
        log.info("mps_daemon_retired", resource=daemon.resource, gpus_set_default=back)

    def _send(self, daemon: Daemon, command: str) -> str:
        if self._control is None:
            raise BackendError("no nvidia-cuda-mps-control")
        return self._control.send(daemon.pipe_dir, daemon.log_dir, command)


async def retire(retirement: MpsRetirement, probe_s: float) -> None:
    """Until every retired daemon is stopped: a step each probe period, off the loop."""
    while retirement.daemons:
        await asyncio.to_thread(retirement.step)
        if retirement.daemons:
            await asyncio.sleep(probe_s)  # the probe period, a timer
