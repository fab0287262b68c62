"""On a node whose GPUs are all Healthy and all answer the event thread's touches, the
family's full NVML probe runs on one tick in QUIET_PROBES; as soon as the touches no
longer say every GPU answered, the next tick probes in full, and a GPU lost without any
event is seen there."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.config import Config
from agents.gpu.family import QUIET_PROBES, GpuFamily
from agents.hw.nvml import GpuTouches
from agents.sim.simnode import SimulatedNode
from agents.tasks import until
from tests.conditions import async_wait_until
from tests.families import gpu_family
from tests.integration.test_gpu_probe import SteppedNvml
from tests.timing import SHORT


class TouchedNvml(SteppedNvml):
    """SteppedNvml with the real backend's account of its touches: `answering` says
    whether every GPU answered the last round; each question is counted (one per tick
    that considered skipping the full probe)."""

    def __init__(self, node: SimulatedNode) -> None:
        super().__init__(node.nvml)
        self.answering = True
        self.asked = 0

    def answered_at(self) -> float | None:
        self.asked += 1
        return time.monotonic() if self.answering else None


@dataclass
class Quiet:
    family: GpuFamily
    nvml: TouchedNvml
    gpus: int

    def full_probes(self) -> int:
        return self.nvml.status_calls // self.gpus


@pytest.fixture
async def quiet(node_file: Path, tmp_path: Path) -> AsyncIterator[Quiet]:
    node = SimulatedNode(node_file, tmp_path / "root")
    node.load()
    nvml = TouchedNvml(node)
    assert isinstance(nvml, GpuTouches)
    family = gpu_family(nvml, node.sysfs, Config.default(), timing=SHORT)
    stop = asyncio.Event()
    task = asyncio.ensure_future(until(stop, family.run))
    try:
        yield Quiet(family, nvml, len(node.spec.gpus))
    finally:
        stop.set()
        nvml.tick()
        await asyncio.wait_for(task, 5)


async def test_a_quiet_node_is_probed_in_full_once_in_quiet_probes_ticks(quiet: Quiet) -> None:
    # The probe at start is full; then QUIET_PROBES - 1 ticks rely on the touches, and
    # the next one probes in full, twice over.
    await async_wait_until(lambda: quiet.full_probes() >= 3, what="three full probes")
    relied = 2 * (QUIET_PROBES - 1)
    assert relied <= quiet.nvml.asked <= relied + 1  # the next tick may have begun


async def test_a_gpu_lost_without_an_event_is_seen_at_the_next_tick_once_a_touch_fails(
    quiet: Quiet,
) -> None:
    await async_wait_until(lambda: quiet.nvml.asked >= 2, what="quiet ticks")
    lost = quiet.family.gpus[3].uuid
    quiet.nvml.lose(lost)
    quiet.nvml.answering = False  # the event thread's touch of it failed
    asked = quiet.nvml.asked
    await async_wait_until(lambda: quiet.family.healthy_count() == quiet.gpus - 1, what="lost")
    # One tick asked the touches, was told no, and probed in full.
    assert quiet.nvml.asked - asked <= 1
