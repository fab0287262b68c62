"""NVML calls off the event loop: a GPU whose call hangs reads as hung after the bound and
holds up neither the other GPUs' answers nor the caller."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest

from agents.errors import BackendError
from agents.hw.nvml import GpuInfo, GpuStatus, XidEvent
from agents.hw.nvml_calls import StatusProbe, bounded, waited

HANG_S = 0.3


class BlockingNvml:
    """status() of GPU "B" blocks until released; the others answer at once."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def init(self) -> None: ...

    def shutdown(self) -> None: ...

    def driver_version(self) -> str:
        return "0"

    def cuda_driver_version(self) -> str:
        return "0"

    def gpus(self) -> Sequence[GpuInfo]:
        return []

    def compute_mode(self, uuid: str) -> str:
        return "DEFAULT"

    def set_compute_mode(self, uuid: str, mode: str) -> None: ...

    def status(self, uuid: str) -> GpuStatus:
        if uuid == "B":
            self.release.wait(30)
        return GpuStatus(lost=False)

    async def next_events(self, timeout_s: float) -> list[XidEvent]:
        return []


async def test_a_hung_gpu_reads_hung_after_the_bound_and_the_others_keep_answering() -> None:
    nvml = BlockingNvml()
    probe = StatusProbe(nvml, hang_s=HANG_S)
    try:
        first = await probe.statuses(["A", "B", "C"], wait_s=0.1)
        assert set(first) == {"A"}  # B hangs; C, behind it, is asked at the next tick
        began = time.monotonic()
        seen: dict[str, GpuStatus] = {}
        while not seen.get("B", GpuStatus(lost=False)).hung:
            assert time.monotonic() - began < 5, seen
            seen = await probe.statuses(["A", "B", "C"], wait_s=0.1)
            assert {"A", "C"} <= set(seen) and not seen["A"].hung and not seen["C"].hung
        nvml.release.set()
        began = time.monotonic()
        while seen.get("B", GpuStatus(lost=False, hung=True)).hung:
            assert time.monotonic() - began < 5, seen
            seen = await probe.statuses(["A", "B", "C"], wait_s=0.1)
        assert seen["B"].answering
    finally:
        nvml.release.set()
        probe.close()


def test_waited_turns_a_hang_into_a_backend_error_within_its_bound() -> None:
    hang = threading.Event()
    began = time.monotonic()
    with pytest.raises(BackendError, match=r"no answer within 0\.2 s"):
        waited(lambda: hang.wait(30), 0.2, "init")
    assert time.monotonic() - began < 2
    hang.set()
    assert waited(lambda: 7, 1) == 7


async def test_bounded_leaves_a_hung_call_behind_and_keeps_the_loop_free() -> None:
    hang = threading.Event()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.01)

    task = asyncio.ensure_future(ticker())
    try:
        with pytest.raises(BackendError):
            await bounded(lambda: hang.wait(30), 0.3, "shutdown")
        assert ticks >= 5  # the loop kept running while the call hung
    finally:
        hang.set()
        task.cancel()
