"""The host's processes as /proc shows them: each one's cgroup (which pod it runs in).
NVML names processes by their host PIDs, so this is the host's /proc: the agent's own
with hostPID, or wherever the host's is mounted; a simulated node has its own."""

from __future__ import annotations

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
