"""The host's processes as /proc shows them: each one's cgroup (which pod it runs in).
NVML names processes by their host PIDs, so this is the host's /proc: the agent's own
with hostPID, or wherever the host's is mounted; a simulated node has its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from agents.core.pod_cgroup import PodCgroup, pod_of

PROC = Path("/proc")


class Procfs:
    """Reads `<root>/<pid>/...`. Blocking; call it off the event loop."""

    def __init__(self, root: Path = PROC) -> None:
        self.root = root

    def pod(self, pid: int) -> PodCgroup | None:
        """The pod the process runs in; None for one outside every pod, one that has
        ended, or one this /proc does not show (the agent without hostPID)."""
        try:
            text = (self.root / str(pid) / "cgroup").read_text(errors="replace")
        except OSError:
            return None
        return pod_of(text)

    def has(self, pid: int) -> bool:
        """Whether this /proc shows the process at all."""
        return (self.root / str(pid)).is_dir()

    def pids(self) -> Iterator[int]:
        """Every process this /proc shows now."""
        try:
            names = [entry.name for entry in self.root.iterdir()]
        except OSError:
            return
        yield from (int(name) for name in names if name.isdigit())

    def uid(self, pid: int) -> int | None:
        """The process's real user ID (`Uid:` of its status); None once it has ended."""
        try:
            text = (self.root / str(pid) / "status").read_text(errors="replace")
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("Uid:"):
                fields = line.split()
                return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
        return None

    def environ_has(self, pid: int, name: str) -> bool:
        """Whether the process was started with the variable `name` (reading another
        user's environment needs root, as the agent is where it looks)."""
        try:
            data = (self.root / str(pid) / "environ").read_bytes()
        except OSError:
            return False
        return any(v.startswith(name.encode() + b"=") for v in data.split(b"\0"))
