"""Where the MPS control daemon runs. From a container that shares the host's PID namespace
and may enter the host's namespaces, on the host, in a cgroup of its own, so that stopping
the agent's container (a rollout) does not stop it; elsewhere in place, beside the agent."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
BINARY = "nvidia-cuda-mps-control"
CGROUP = "node-agents-mps"  # the daemon's cgroup, a child of each hierarchy's root
CGROUP_ROOT = "/sys/fs/cgroup"  # the host's, as the host sees it
# Where the host has the driver's programs: its own root, the GPU operator's driver root.
HOST_DRIVER_ROOTS = ("/", "/run/nvidia/driver")
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHM = "shm"  # the clients' /dev/shm, beside the pipe directories under flags.mpsRoot
ANCESTORS = 64  # how far up its process tree the agent looks for the host's namespaces
# A mount namespace of the daemon's own (a copy of the host's, host mounts still seen):
# its /dev/shm is the clients' shared memory directory, as NVIDIA's daemon container has it.
UNSHARE = ("unshare", "--mount", "--propagation", "slave", "--")

# Run on the host by /bin/sh, values only as arguments ($1 cgroup root, $2 shared memory
# directory or "", $3 driver root, $4 program, then the cgroup hierarchies, "." for a
# unified one). It moves itself into CGROUP of each hierarchy (a new cgroup v1 cpuset
# starts empty and takes no process: it gets its parent's CPUs and memory nodes), binds
# the shared memory, then becomes the program: `-d` forks the daemon, which inherits both.
MOVE = """\
for h in "$@"; do
    d=$cg/$h/node-agents-mps
    mkdir -p "$d"
    for f in cpuset.cpus cpuset.mems; do
        if [ -f "$d/$f" ] && [ -f "$cg/$h/$f" ] && [ -z "$(cat "$d/$f")" ]; then
            cat "$cg/$h/$f" > "$d/$f"
        fi
    done
    echo $$ > "$d/cgroup.procs"
done
"""
SCRIPT = (
    "set -eu\ncg=$1 shm=$2 root=$3 bin=$4\nshift 4\n"
    + MOVE
    + """\
if [ -n "$shm" ]; then mount --bind "$shm" "${root%/}/dev/shm"; fi
if [ "$root" = / ]; then exec "$bin" -d; fi
exec chroot "$root" "$bin" -d
"""
)
# The same move for a program of the agent's own filesystem (the simulator's twin), run
# in the agent's mount namespace: $1 the host's cgroup root as the agent sees it, $2 the
# program, then the hierarchies.
ESCAPE = "set -eu\ncg=$1 bin=$2\nshift 2\n" + MOVE + 'exec "$bin" -d\n'


def nsenter(pid: int) -> tuple[str, ...]:
    """Into the mount and cgroup namespaces of `pid`, the host's: the cgroup one too,
    because where cgroup namespaces are delegation boundaries (nsdelegate) a process in
    the container's may not move anything to a cgroup outside it."""
    return ("nsenter", "--target", str(pid), "--mount", "--cgroup", "--")


@dataclass(frozen=True)
class Where:
    """Whether the daemon can be started on the host, entered through the namespaces of
    `pid`; if not, and the agent is in a container, why the daemon lives (and dies) with
    the agent's container."""

    host: bool
    warning: str = ""
    pid: int = 1


def where(proc: Path = PROC, environ: Mapping[str, str] = os.environ) -> Where:
    """Blocking. On the host when PID 1's mount namespace is readable and not the agent's:
    the agent is in a container that shares the host's PID namespace. Where PID 1's is
    not readable (an init that keeps it to itself), through the nearest ancestor outside
    the agent's mount namespace: the container runtime's shim, in the node's namespaces."""
    try:
        ours = os.readlink(proc / "self" / "ns" / "mnt")
        host = os.readlink(proc / "1" / "ns" / "mnt")
    except OSError as exc:
        pid = _ancestor_outside(proc)
        if pid is not None:
            return Where(True, pid=pid)
        return Where(False, f"PID 1's mount namespace is not readable: {exc.strerror}")
    if host != ours:
        return Where(True)
    if "KUBERNETES_SERVICE_HOST" in environ:  # a pod without the host's PID namespace
        return Where(False, "the agent's pod does not share the host's PID namespace")
    return Where(False)  # on the host itself


def _ancestor_outside(proc: Path) -> int | None:
    """The nearest ancestor (PID 1 left out) whose mount namespace is readable and not
    the agent's; None if none is."""
    try:
        ours = os.readlink(proc / "self" / "ns" / "mnt")
        pid = _parent(proc / "self")
        for _ in range(ANCESTORS):
            if pid <= 1:
                return None
            try:
                if os.readlink(proc / str(pid) / "ns" / "mnt") != ours:
                    return pid
            except OSError:
                pass
            pid = _parent(proc / str(pid))
    except (OSError, ValueError, IndexError):
        return None
    return None


def _parent(process: Path) -> int:
    """Its parent's PID, from `stat` (after the command's name, which may hold anything)."""
    return int((process / "stat").read_text().rpartition(")")[2].split()[1])


@dataclass(frozen=True)
class HostLaunch:
    """The driver's program as the host sees it (`binary` under `driver_root`, which is
    entered with chroot unless it is /), started and told commands from the agent."""

    binary: str
    driver_root: str = "/"
    proc: Path = PROC
    pid: int = 1  # whose namespaces are the host's

    @classmethod
    def find(
        cls, proc: Path = PROC, pid: int = 1, roots: tuple[str, ...] = HOST_DRIVER_ROOTS
    ) -> HostLaunch | None:
        """Blocking. The program under one of the host's driver roots; None if none."""
        for root in roots:
            for directory in ("usr/bin", "bin"):
                binary = posixpath.join("/", directory, BINARY)
                # Seen through the host's root; a link in it may be absolute: not followed.
                if os.path.lexists(f"{proc}/{pid}/root{posixpath.join(root, directory, BINARY)}"):
                    return cls(binary, root, proc, pid)
        return None

    def start(self, pipe_dir: str) -> list[str]:
        """The command that starts the daemon on the host, outside the agent's cgroup."""
        cgroups = cgroup_hierarchies(Path(f"{self.proc}/{self.pid}/root{CGROUP_ROOT}"))
        shm = shm_dir(pipe_dir) or ""
        args = [CGROUP_ROOT, shm, self.driver_root, self.binary, *cgroups]
        return [*nsenter(self.pid), *UNSHARE, "/bin/sh", "-c", SCRIPT, CGROUP, *args]

    def send(self) -> list[str]:
        """The command that tells the daemon one command (on stdin): the pipe directory is
        a host directory at the same path in the agent's container and on the host."""
        chroot = [] if self.driver_root == "/" else ["chroot", self.driver_root]
        return [*nsenter(self.pid), *chroot, self.binary]


@dataclass(frozen=True)
class CgroupLaunch:
    """A program of the agent's own filesystem, the simulator's twin of the driver's,
    started outside the agent's cgroup but in its mount namespace, which the daemon then
    keeps alive when the container ends: a simulated node's daemon outlives a rollout of
    the agent's pod as the driver's (HostLaunch) does. Told commands in place."""

    binary: str
    proc: Path = PROC
    pid: int = 1  # whose namespaces are the host's

    def start(self, pipe_dir: str) -> list[str]:
        """The command that starts the daemon in a cgroup of its own."""
        root = f"{self.proc}/{self.pid}/root{CGROUP_ROOT}"
        escape = ["/bin/sh", "-c", ESCAPE, CGROUP, root, self.binary]
        return [
            "nsenter",
            "--target",
            str(self.pid),
            "--cgroup",
            "--",
            *escape,
            *cgroup_hierarchies(Path(root)),
        ]

    def send(self) -> list[str]:
        return [self.binary]


def cgroup_hierarchies(root: Path) -> tuple[str, ...]:
    """Blocking. The hierarchies mounted under `root` (the host's /sys/fs/cgroup): "." for
    cgroup v2, else one directory per v1 hierarchy (links to them, e.g. cpu, left out)."""
    if (root / "cgroup.controllers").exists():
        return (".",)
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return ()
    return tuple(
        e.name
        for e in entries
        if e.is_dir() and not e.is_symlink() and (e / "cgroup.procs").exists()
    )


def shm_dir(pipe_dir: str) -> str | None:
    """Blocking. The clients' shared memory directory of a daemon whose pipes are in
    `pipe_dir` (<root>/<resource>/pipe, a resource name holding one slash or none): the
    nearest `shm` directory above the resource's own, which is not a resource's; None if
    there is none."""
    parent = posixpath.dirname(posixpath.dirname(pipe_dir.rstrip("/")))
    for above in (parent, posixpath.dirname(parent)):
        candidate = posixpath.join(above, SHM)
        if os.path.isdir(candidate) and not os.path.isdir(posixpath.join(candidate, "pipe")):
            return candidate
    return None
