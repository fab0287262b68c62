"""Deadlines that hold on a loaded machine: time a process spent waiting for a CPU is not
counted, so a wait fails for an agent that is slow or stuck, not for a busy machine."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path


def run_queue_seconds(pid: int) -> float | None:
    """How long the main thread of `pid` has been runnable but not running (its run
    delay in /proc/<pid>/schedstat); None once the process is gone."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (FileNotFoundError, ProcessLookupError, IndexError, ValueError):
        return None


class UnstarvedClock:
    """Seconds since creation less the longest run-queue wait of `pids` since then.

    Every process a condition needs is counted (the agent, and this one, where the
    kubelet stand-in runs): if any of them waited for a CPU, that time is not the
    agent's to answer for. Where the kernel keeps no schedstat, this is wall time."""

    def __init__(self, pids: Sequence[int]) -> None:
        self._start = time.monotonic()
        self._first = {pid: run_queue_seconds(pid) or 0.0 for pid in pids}
        self._waited = dict.fromkeys(pids, 0.0)

    def wall(self) -> float:
        return time.monotonic() - self._start

    def elapsed(self) -> float:
        for pid, first in self._first.items():
            now = run_queue_seconds(pid)
            if now is not None:  # a process that is gone keeps its last figure
                self._waited[pid] = max(self._waited[pid], now - first)
        return max(self.wall() - max(self._waited.values(), default=0.0), 0.0)
