"""The benchmarks' CPU clock: a process's threads' time to the ns while the same threads
run; its ticks (which count every thread, ended ones too) once a thread came or went."""

from __future__ import annotations

import os
import threading
import time

from hack.benchlib.agent import cpu_seconds_between, proc_cpu_reading


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_the_same_threads_are_timed_by_their_own_clocks() -> None:
    before = proc_cpu_reading(os.getpid())
    began = time.process_time()
    _burn(0.05)
    spent_here = time.process_time() - began
    after = proc_cpu_reading(os.getpid())
    spent = cpu_seconds_between(before, after)
    assert before[1].keys() == after[1].keys()
    assert spent >= spent_here * 0.9  # the readings' own work adds a little
    assert spent == sum(after[1][t] - before[1][t] for t in after[1]) / 1e9


def test_a_thread_that_came_and_went_is_counted_by_the_ticks() -> None:
    before = proc_cpu_reading(os.getpid())
    worker = threading.Thread(target=_burn, args=(0.2,))
    worker.start()
    worker.join()
    after = proc_cpu_reading(os.getpid())
    # The worker has ended: the same threads are listed, and none of them ran 0.2 s.
    assert before[1].keys() == after[1].keys()
    assert cpu_seconds_between(before, after) >= 0.15
