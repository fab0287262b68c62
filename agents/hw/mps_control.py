"""The MPS control daemon behind a Protocol: the driver's `nvidia-cuda-mps-control`,
started detached so that it outlives the agent (on the host where the agent may reach it:
agents.hw.mps_launch), and told commands through its pipe."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import structlog

from agents.errors import BackendError
from agents.hw.mps_launch import (
    BINARY,
    HOST_DRIVER_ROOTS,
    HOST_PATH,
    PROC,
    CgroupLaunch,
    HostLaunch,
    Where,
    where,
)

log = structlog.get_logger(__name__)

PIPE_VARIABLE = "CUDA_MPS_PIPE_DIRECTORY"
LOG_VARIABLE = "CUDA_MPS_LOG_DIRECTORY"
SERVER_LIST = "get_server_list"  # the PIDs of the daemon's MPS servers
CLIENT_LIST = "get_client_list"  # + a server's PID: the PIDs of its clients
# Where the driver's tools are: the host's own, the driver root NVIDIA's chart mounts,
# and the GPU operator's driver container root.
DRIVER_ROOTS = ("/", "/driver-root", "/run/nvidia/driver")
COMMAND_WAIT_S = 10.0  # one command, or the daemon's start


class MpsControl(Protocol):
    """One control daemon per pipe directory; every call blocks."""

    def start(self, pipe_dir: str, log_dir: str) -> None:
        """Start a daemon for `pipe_dir`; BackendError when it does not start."""

    def send(self, pipe_dir: str, log_dir: str, command: str) -> str:
        """The daemon's answer to `command`; BackendError when none answers."""


class MpsControlBinary:
    """The driver's control program (or the simulator's twin of it, at another path): run
    in place, or with `host` on the host, where `binary` is only what the agent saw."""

    def __init__(
        self, binary: str, host: HostLaunch | CgroupLaunch | None = None, warning: str = ""
    ) -> None:
        self.binary = binary
        self.host = host
        self._warning = warning  # why a daemon started in place dies with the container

    @classmethod
    def find(
        cls, roots: Sequence[str] = DRIVER_ROOTS, proc: Path = PROC
    ) -> MpsControlBinary | None:
        """Blocking. On the host, the host's program where the agent can start it there;
        else the program under one of the driver roots or on PATH; None if none."""
        placed = where(proc)
        if placed.host:
            host = HostLaunch.find(proc, placed.pid)
            if host is not None:
                return cls(host.binary, host)
        dirs = [os.path.join(r, d) for r in roots for d in ("usr/bin", "bin")]
        found = shutil.which(BINARY, path=os.pathsep.join([*dirs, os.environ.get("PATH", "")]))
        if placed.host:  # found here only, so run here
            placed = Where(False, f"the host has no {BINARY} under {', '.join(HOST_DRIVER_ROOTS)}")
        return None if found is None else cls(found, warning=placed.warning)

    def start(self, pipe_dir: str, log_dir: str) -> None:
        # `-d` forks the daemon and returns; a session of its own keeps it out of the
        # agent's process group, so that stopping the agent does not signal it.
        if self.host is not None:
            self._run(self.host.start(pipe_dir), pipe_dir, log_dir, "", detached=True)
            return
        if self._warning:
            log.warning(
                "mps_daemon_in_agent_container",
                reason=self._warning,
                effect="a restart or rollout of the agent's pod stops the daemon",
                fix="hostPID: true and privileged (the chart's mps.enabled: true)",
            )
            self._warning = ""  # said once
        self._run([self.binary, "-d"], pipe_dir, log_dir, "", detached=True)

    def send(self, pipe_dir: str, log_dir: str, command: str) -> str:
        argv = [self.binary] if self.host is None else self.host.send()
        return self._run(argv, pipe_dir, log_dir, command + "\n", detached=False)

    def _run(self, argv: list[str], pipe: str, log: str, stdin: str, *, detached: bool) -> str:
        path = HOST_PATH if self.host is not None else os.environ.get("PATH", "/usr/bin:/bin")
        env = {"PATH": path, PIPE_VARIABLE: pipe, LOG_VARIABLE: log}
        try:
            done = subprocess.run(
                argv,
                input=stdin,
                env=env,
                capture_output=True,
                text=True,
                timeout=COMMAND_WAIT_S,
                start_new_session=detached,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BackendError(f"{self.binary}: {exc}") from exc
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip() or f"exit status {done.returncode}"
            raise BackendError(f"{self.binary}{' -d' if detached else ''}: {said}")
        return done.stdout.strip()
