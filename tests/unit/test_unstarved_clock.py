"""The soak tests' clock: wall time less the time a process waited for a CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from tests.conditions import wait_until
from tests.soak.unstarved import UnstarvedClock, run_queue_seconds

BUSY = "while True: pass"


@pytest.fixture
def busy_on_one_cpu() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Three busy loops that share one CPU (each gets about a third of it)."""
    cpu = min(os.sched_getaffinity(0))
    loops = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(3)]
    try:
        for loop in loops:
            os.sched_setaffinity(loop.pid, {cpu})
        yield loops
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def test_time_a_process_waits_for_a_cpu_is_not_counted(
    busy_on_one_cpu: list[subprocess.Popen[bytes]],
) -> None:
    watched = busy_on_one_cpu[0].pid
    clock = UnstarvedClock([watched])
    wait_until(lambda: clock.wall() >= 1.0, 10.0, "a second of wall time")
    # Runnable all along, it ran about a third of the time and waited the rest.
    assert clock.elapsed() < 0.6 * clock.wall()


def test_a_process_that_is_gone_counts_wall_time() -> None:
    gone = 4_194_305  # above the largest pid_max: no process has it
    assert run_queue_seconds(gone) is None
    clock = UnstarvedClock([gone])
    start = time.monotonic()
    wait_until(lambda: time.monotonic() - start >= 0.2, 5.0, "0.2 s")
    assert clock.elapsed() == pytest.approx(clock.wall(), abs=0.05)
