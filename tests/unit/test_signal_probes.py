"""Degraded-device probes off the event loop: readings in a worker thread, failures left
out, and a round that hangs holds up no later tick and grows no backlog."""

from __future__ import annotations

import threading

from agents.errors import BackendError
from agents.hw.signal_probes import SignalProbes


class Reader:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.release.set()
        self.calls: list[str] = []
        self.loop_thread = threading.get_ident()
        self.threads: set[int] = set()

    def __call__(self, key: str) -> int:
        self.calls.append(key)
        self.threads.add(threading.get_ident())
        if key == "lost":
            raise BackendError("NVML probe: GPU is lost")
        self.release.wait(30)
        return len(key)


async def test_each_key_is_read_off_the_loop_and_failures_are_left_out() -> None:
    reader = Reader()
    probes = SignalProbes(reader, "test-signals")
    try:
        assert await probes.readings(["a", "lost", "ccc"], wait_s=5) == {"a": 1, "ccc": 3}
        assert reader.loop_thread not in reader.threads
    finally:
        probes.close()


async def test_a_hung_round_answers_nothing_until_it_returns_then_its_readings() -> None:
    reader = Reader()
    reader.release.clear()
    probes = SignalProbes(reader, "test-signals")
    try:
        assert await probes.readings(["a", "bb"], wait_s=0.05) == {}
        assert await probes.readings(["a", "bb"], wait_s=0.05) == {}
        assert reader.calls == ["a"]  # no second round queued behind the hung one
        reader.release.set()
        assert await probes.readings(["x"], wait_s=5) == {"a": 1, "bb": 2}
        assert await probes.readings(["x"], wait_s=5) == {"x": 1}
        assert len(reader.threads) == 1
    finally:
        reader.release.set()
        probes.close()
