"""The MPS control daemon behind a Protocol: the driver's `nvidia-cuda-mps-control`,
started detached so that it outlives the agent, and told commands through its pipe."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from typing import Protocol

from agents.errors import BackendError

PIPE_VARIABLE = "CUDA_MPS_PIPE_DIRECTORY"
LOG_VARIABLE = "CUDA_MPS_LOG_DIRECTORY"
BINARY = "nvidia-cuda-mps-control"
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
    """The driver's control program (or the simulator's twin of it, at another path)."""

    def __init__(self, binary: str) -> None:
        self.binary = binary

    @classmethod
    def find(cls, roots: Sequence[str] = DRIVER_ROOTS) -> MpsControlBinary | None:
        """Blocking. The program under one of the driver roots or on PATH; None if none."""
        dirs = [os.path.join(r, d) for r in roots for d in ("usr/bin", "bin")]
        found = shutil.which(BINARY, path=os.pathsep.join([*dirs, os.environ.get("PATH", "")]))
        return None if found is None else cls(found)

    def start(self, pipe_dir: str, log_dir: str) -> None:
        # `-d` forks the daemon and returns; a session of its own keeps it out of the
        # agent's process group, so that stopping the agent does not signal it.
        self._run(["-d"], pipe_dir, log_dir, "", detached=True)

    def send(self, pipe_dir: str, log_dir: str, command: str) -> str:
        return self._run([], pipe_dir, log_dir, command + "\n", detached=False)

    def _run(self, args: list[str], pipe: str, log: str, stdin: str, *, detached: bool) -> str:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), PIPE_VARIABLE: pipe}
        env[LOG_VARIABLE] = log
        try:
            done = subprocess.run(
                [self.binary, *args],
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
            raise BackendError(f"{' '.join([self.binary, *args])}: {said}")
        return done.stdout.strip()
