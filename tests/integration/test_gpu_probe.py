"""The GPU family's probe loop: quiet while nothing changes, and a GPU that falls off the
bus without any event is still seen at the next probe."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.config import parse_config
from agents.errors import BackendError
from agents.gpu.family import GpuFamily
from agents.hw.nvml import GpuInfo, GpuStatus, XidEvent
from agents.sim.nvml import SimNvml
from agents.sim.simnode import SimulatedNode
from agents.tasks import until
from tests.conditions import async_wait_until
from tests.families import gpu_family

REPLICAS = 4


class SteppedNvml:
    """An Nvml whose probe ticks the test drives: each tick() ends one next_events() wait.
    `lose(uuid)` makes a GPU fall off the bus without any event."""

    def __init__(self, inner: SimNvml) -> None:
        self._inner = inner
        self._ticks: asyncio.Queue[None] = asyncio.Queue()
        self._lost: set[str] = set()
        self.status_calls = 0
        self.failures = 0  # next_events() calls still to fail, as a broken event wait does
        self.shutdowns = 0

    def tick(self) -> None:
        self._ticks.put_nowait(None)

    def lose(self, uuid: str) -> None:
        self._lost.add(uuid)

    def init(self) -> None:
        self._inner.init()

    def shutdown(self) -> None:
        self.shutdowns += 1
        self._inner.shutdown()

    def driver_version(self) -> str:
        return self._inner.driver_version()

    def cuda_driver_version(self) -> str:
        return self._inner.cuda_driver_version()

    def gpus(self) -> Sequence[GpuInfo]:
        return self._inner.gpus()

    def compute_mode(self, uuid: str) -> str:
        return self._inner.compute_mode(uuid)

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        self._inner.set_compute_mode(uuid, mode)

    def status(self, uuid: str) -> GpuStatus:
        self.status_calls += 1
        if uuid in self._lost:
            return GpuStatus(lost=True)
        return self._inner.status(uuid)

    async def next_events(self, timeout_s: float) -> list[XidEvent]:
        if self.failures > 0:
            self.failures -= 1
            raise BackendError("NVML events: the wait failed")
        await self._ticks.get()
        return []


@dataclass
class Probed:
    family: GpuFamily
    nvml: SteppedNvml
    gpus: int

    async def probes_done(self, n: int) -> None:
        """Wait until `n` probes after the one at start have read every GPU."""
        want = (n + 1) * self.gpus
        await async_wait_until(lambda: self.nvml.status_calls >= want, what=f"{n} probes")


async def start_family(node_file: Path, root: Path) -> tuple[GpuFamily, SteppedNvml, int]:
    node = SimulatedNode(node_file, root)
    node.load()
    nvml = SteppedNvml(node.nvml)
    sharing = f"{{resources: [{{name: nvidia.com/gpu, replicas: {REPLICAS}}}]}}"
    config = parse_config(f"sharing: {{timeSlicing: {sharing}}}", "<test>")
    family = gpu_family(nvml, node.sysfs, config)
    return family, nvml, len(node.spec.gpus)


@pytest.fixture
async def probed(node_file: Path, tmp_path: Path) -> AsyncIterator[Probed]:
    family, nvml, gpus = await start_family(node_file, tmp_path / "root")
    stop = asyncio.Event()
    task = asyncio.ensure_future(until(stop, family.run))
    try:
        yield Probed(family, nvml, gpus)
    finally:
        stop.set()
        nvml.tick()
        await asyncio.wait_for(task, 5)


async def test_probes_of_an_unchanged_node_leave_the_device_list_untouched(
    probed: Probed,
) -> None:
    (resource,) = probed.family.resources()
    version = resource.inventory.version
    for _ in range(5):
        probed.nvml.tick()
    await probed.probes_done(5)
    assert resource.inventory.version == version
    assert all(d.healthy for d in resource.inventory.devices)


async def test_gpu_lost_without_an_event_turns_its_replicas_unhealthy_at_the_next_probe(
    probed: Probed,
) -> None:
    (resource,) = probed.family.resources()
    lost = probed.family.gpus[2].uuid
    version = resource.inventory.version
    probed.nvml.lose(lost)
    probed.nvml.tick()
    await probed.probes_done(1)
    assert resource.inventory.version == version + 1
    unhealthy = {d.id for d in resource.inventory.devices if not d.healthy}
    assert unhealthy == {f"{lost}::{n}" for n in range(REPLICAS)}
    assert probed.family.healthy_count() == probed.gpus - 1
    for _ in range(3):  # still lost: nothing more to send
        probed.nvml.tick()
    await probed.probes_done(4)
    assert resource.inventory.version == version + 1


async def test_stop_ends_the_family_while_nvml_is_still_waiting(
    node_file: Path, tmp_path: Path
) -> None:
    family, nvml, _ = await start_family(node_file, tmp_path / "root")
    stop = asyncio.Event()
    task = asyncio.ensure_future(until(stop, family.run))
    await async_wait_until(lambda: nvml.status_calls > 0, what="the first probe")
    stop.set()  # no tick: the NVML wait is still pending
    await asyncio.wait_for(task, 5)
    assert nvml.shutdowns == 1


async def test_a_failed_event_wait_is_logged_and_probing_goes_on(
    node_file: Path, tmp_path: Path
) -> None:
    family, nvml, gpus = await start_family(node_file, tmp_path / "root")
    nvml.failures = 1
    lost = family.gpus[0].uuid
    nvml.lose(lost)
    stop = asyncio.Event()
    task = asyncio.ensure_future(until(stop, family.run))
    try:
        await async_wait_until(lambda: family.healthy_count() == gpus - 1, what="the probe")
        assert not task.done()
    finally:
        stop.set()
        await asyncio.wait_for(task, 5)
