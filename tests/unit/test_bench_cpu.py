"""The benchmarks' CPU clock, read from outside as they read the agent's: a process's
threads' time to the ns while the same threads run; its ticks (which count every thread,
ended ones too) once a thread came or went."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from hack.benchlib.agent import cpu_seconds_between, proc_cpu_reading

# The measured process: a child with only the threads each test asks for. The test's own
# process will not do: other tests leave threads in it (gRPC's, executors') that come
# and go on their own, and a joined thread lingers in /proc/<pid>/task for a moment.
CHILD = r"""
import os, sys, threading, time

def burn(seconds):
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass

for line in sys.stdin:
    began = time.thread_time()
    if line.strip() == "burn":
        burn(0.05)
    else:  # "thread": one that burns 0.2 s and ends
        worker = threading.Thread(target=burn, args=(0.2,))
        worker.start()
        worker.join()
        # join returns once the thread's Python side is done; its OS thread ends after.
        deadline = time.monotonic() + 10
        while str(worker.native_id) in os.listdir("/proc/self/task"):
            if time.monotonic() > deadline:
                sys.exit("the worker thread never ended")
            time.sleep(0.001)
    print(time.thread_time() - began, flush=True)
"""


class Child:
    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.pid = process.pid

    def run(self, what: str) -> float:
        """Has it do `what` ("burn" or "thread"); the CPU seconds its main thread spent."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{what}\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        assert answer, f"the child exited: {self.process.wait(10)}"
        return float(answer)


@pytest.fixture
def child() -> Iterator[Child]:
    # Leaving the block closes its input, at whose end it exits, and waits for that.
    with subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as process:
        yield Child(process)
    assert process.returncode == 0


def test_the_same_threads_are_timed_by_their_own_clocks(child: Child) -> None:
    before = proc_cpu_reading(child.pid)
    spent_there = child.run("burn")
    after = proc_cpu_reading(child.pid)
    spent = cpu_seconds_between(before, after)
    assert before[1].keys() == after[1].keys()
    assert spent >= spent_there * 0.9
    assert spent == sum(after[1][t] - before[1][t] for t in after[1]) / 1e9


def test_a_thread_that_came_and_went_is_counted_by_the_ticks(child: Child) -> None:
    before = proc_cpu_reading(child.pid)
    child.run("thread")
    after = proc_cpu_reading(child.pid)
    # The worker has ended: the same threads are listed, and none of them ran 0.2 s.
    assert before[1].keys() == after[1].keys()
    assert cpu_seconds_between(before, after) >= 0.15
