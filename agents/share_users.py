"""Pods of shares that wait behind another Linux user: an MPS control daemon runs one
server at a time, for one user, and a client of another user waits until that server's
clients are gone. The servers come from the daemon's `get_server_list`, their users and
the clients' from /proc."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from agents.errors import BackendError
from agents.hw.mps_control import PIPE_VARIABLE, SERVER_LIST, MpsControl
from agents.hw.procfs import Procfs
from agents.hw.signal_probes import SignalProbes

if TYPE_CHECKING:
    from agents.backends import Backends
    from agents.config import Config

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Waiting:
    """A pod with an MPS client of user `uid` while the daemon serves `server_uid`."""

    pod_uid: str
    uid: int
    server_uid: int


@dataclass(frozen=True)
class MpsPipes:
    """Where the shares' control daemon listens, and where it logs."""

    control: MpsControl
    pipe_dir: str
    log_dir: str

    def servers(self) -> list[int]:
        """Blocking: the PIDs of the servers the daemon runs now; BackendError when it
        does not answer."""
        answer = self.control.send(self.pipe_dir, self.log_dir, SERVER_LIST)
        return [int(word) for word in answer.split() if word.isdigit()]


def waiting(servers: Iterable[int], procfs: Procfs, pods: Collection[str]) -> list[Waiting]:
    """Blocking: the processes of `pods` (pod UIDs) that are MPS clients (started with
    the pipe directory's variable) of another user than every running server's; none
    while no server runs (the next client's user gets one)."""
    server_uids = {uid for pid in servers if (uid := procfs.uid(pid)) is not None}
    if not server_uids or not pods:
        return []
    found: dict[tuple[str, int], Waiting] = {}
    for pid in procfs.pids():
        uid = procfs.uid(pid)
        if uid is None or uid in server_uids:
            continue
        where = procfs.pod(pid)
        if where is None or where.pod_uid not in pods:
            continue
        if procfs.environ_has(pid, PIPE_VARIABLE):
            server = min(server_uids)
            found.setdefault((where.pod_uid, uid), Waiting(where.pod_uid, uid, server))
    return list(found.values())


def waiting_message(namespace: str, pod: str, wait: Waiting) -> str:
    return (
        f"Pod {namespace}/{pod} runs its GPU processes as user {wait.uid}, and the node's "
        f"MPS server runs for user {wait.server_uid}: they wait until that user's clients "
        "end (MPS serves one Linux user at a time). Run the pods that share GPUs as one "
        "user (securityContext.runAsUser)"
    )


class ServerUsers:
    """Looks once every `every_s`, off the event loop (one look at a time: a daemon that
    does not answer holds up nothing), for the pods that wait behind another user."""

    def __init__(
        self, pipes: MpsPipes, procfs: Procfs, every_s: float, clock: Callable[[], float]
    ) -> None:
        self._pipes = pipes
        self._procfs = procfs
        self._every_s = every_s
        self._clock = clock
        self._probes = SignalProbes(self._look, "mps-users")
        self._pods: frozenset[str] = frozenset()
        self._last = -math.inf
        self._told: set[tuple[str, int]] = set()  # (pod UID, server user) waiting now
        self._unanswered = False

    async def begun(self, pods: Collection[str], wait_s: float) -> list[Waiting]:
        """The pods (of `pods`, UIDs) that began waiting since the last look: once per
        episode; [] between looks, and when the daemon did not answer."""
        now = self._clock()
        if now - self._last < self._every_s:
            return []
        self._last = now
        self._pods = frozenset(pods)
        looked = await self._probes.readings(["mps"], wait_s) if pods else {"mps": []}
        if "mps" not in looked:
            return []
        now_waiting = {(w.pod_uid, w.server_uid): w for w in looked["mps"]}
        fresh = [w for key, w in now_waiting.items() if key not in self._told]
        self._told = set(now_waiting)
        return fresh

    def _look(self, _: str) -> list[Waiting]:
        """Blocking, in the worker thread."""
        try:
            servers = self._pipes.servers()
        except BackendError as exc:
            if not self._unanswered:
                self._unanswered = True
                log.warning("mps_server_list_unanswered", error=str(exc))
            raise
        self._unanswered = False
        return waiting(servers, self._procfs, self._pods)

    def close(self) -> None:
        self._probes.close()


def server_users(
    backends: Backends, config: Config | None, procfs: Procfs, every_s: float
) -> ServerUsers | None:
    """Where MPS enforces the shares (as the config is at start): their daemon's users."""
    from agents.gpu import mps_paths
    from agents.gpu.shares import MPS_PIPES

    shares = None if config is None else config.sharing.shares  # DRA mode: by claims
    if shares is None or shares.enforce != "mps" or backends.mps is None:
        return None
    host = ("" if backends.dev_root is None else str(backends.dev_root)) + shares.mps_root
    pipes = MpsPipes(
        backends.mps,
        mps_paths.pipe_dir(host, MPS_PIPES),
        mps_paths.log_dir(host, MPS_PIPES),
    )
    return ServerUsers(pipes, procfs, every_s, time.monotonic)
