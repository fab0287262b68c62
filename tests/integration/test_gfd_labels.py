"""GFD's `nvidia.com/` labels in the feature file of an agent on a simulated GB200 tray:
every key and value GFD v0.20 writes there, kept current as GPUs are lost and the fabric
registers late."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.backends import simulated_backends
from agents.config import Config
from agents.daemon import Agent
from agents.plugin.api import DevicePlugins
from agents.sim.bundled import bundled_node
from tests.conditions import WAIT, async_wait_until
from tests.timing import SHORT

GFD = "nvidia.com/"
CLIQUE = GFD + "gpu.clique"
COUNT = GFD + "gpu.count"


@dataclass
class Tray:
    node_file: Path
    features: Path

    def gfd(self) -> dict[str, str]:
        if not self.features.exists():
            return {}
        lines = dict(line.split("=", 1) for line in self.features.read_text().splitlines())
        return {k: v for k, v in lines.items() if k.startswith(GFD)}

    async def becomes(self, check: Callable[[dict[str, str]], bool], what: str) -> None:
        await async_wait_until(lambda: check(self.gfd()), WAIT, what)

    def edit(self, change: Callable[[dict[str, Any]], None]) -> None:
        doc = yaml.safe_load(self.node_file.read_text())
        change(doc)
        tmp = self.node_file.with_name(".node.yaml.tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        tmp.replace(self.node_file)


def _fabric_state(state: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        for gpu in doc["gpus"]:
            gpu["fabric"]["state"] = state

    return change


async def _tray(tmp_path: Path, plugin_dir: Path, fabric: str) -> AsyncIterator[Tray]:
    node_file = tmp_path / "node" / "node.yaml"
    node_file.parent.mkdir()
    shutil.copy(bundled_node("gb200-4gpu-4nic"), node_file)
    tray = Tray(node_file, tmp_path / "features.d" / "node-agents")
    tray.edit(_fabric_state(fabric))
    stop = asyncio.Event()
    async with simulated_backends(node_file) as backends:
        agent = Agent(
            Config.default(),
            "<defaults>",
            DevicePlugins(plugin_dir),
            backends,
            nfd_features_file=tray.features,
            timing=SHORT,
        )
        await agent.start()
        task = asyncio.ensure_future(agent.run(stop))
        try:
            assert backends.simulated is not None
            await asyncio.wait_for(backends.simulated.watching.wait(), WAIT)
            yield tray
        finally:
            stop.set()
            await asyncio.wait_for(task, WAIT)


@pytest.fixture
async def tray(tmp_path: Path, plugin_dir: Path) -> AsyncIterator[Tray]:
    async for made in _tray(tmp_path, plugin_dir, "completed"):
        yield made


@pytest.fixture
async def registering(tmp_path: Path, plugin_dir: Path) -> AsyncIterator[Tray]:
    async for made in _tray(tmp_path, plugin_dir, "inProgress"):
        yield made


EXPECTED = {
    "cuda.driver-version.full": "550.54.15",
    "cuda.driver-version.major": "550",
    "cuda.driver-version.minor": "54",
    "cuda.driver-version.revision": "15",
    "cuda.driver.major": "550",
    "cuda.driver.minor": "54",
    "cuda.driver.rev": "15",
    "cuda.runtime-version.full": "12.4",
    "cuda.runtime-version.major": "12",
    "cuda.runtime-version.minor": "4",
    "cuda.runtime.major": "12",
    "cuda.runtime.minor": "4",
    "gpu.clique": "5a1e2b3c-4d5e-4f60-8172-839405a6b7c8.1",
    "gpu.compute.major": "10",
    "gpu.compute.minor": "0",
    "gpu.count": "4",
    "gpu.family": "blackwell",
    "gpu.machine": "GB200-NVL",
    "gpu.memory": "189471",
    "gpu.mode": "compute",
    "gpu.product": "NVIDIA-GB200",
    "gpu.replicas": "1",
    "gpu.sharing-strategy": "none",
    "mig.capable": "true",
    "mps.capable": "false",
    "vgpu.present": "false",
}


async def test_the_feature_file_holds_every_gfd_label_with_gfds_values(tray: Tray) -> None:
    await tray.becomes(lambda labels: COUNT in labels, "GFD's labels")
    assert tray.gfd() == {GFD + key: value for key, value in EXPECTED.items()}


async def test_a_lost_gpu_lowers_the_count_and_its_return_raises_it(tray: Tray) -> None:
    await tray.becomes(lambda labels: labels.get(COUNT) == "4", "4 GPUs")
    tray.edit(lambda doc: doc["gpus"][3].__setitem__("lost", True))
    await tray.becomes(lambda labels: labels.get(COUNT) == "3", "3 GPUs")
    tray.edit(lambda doc: doc["gpus"][3].__setitem__("lost", False))
    await tray.becomes(lambda labels: labels.get(COUNT) == "4", "4 GPUs again")


async def test_a_fabric_that_registers_late_adds_the_clique(registering: Tray) -> None:
    await registering.becomes(lambda labels: COUNT in labels, "GFD's labels")
    assert CLIQUE not in registering.gfd()
    registering.edit(_fabric_state("completed"))
    await registering.becomes(lambda labels: CLIQUE in labels, "the clique")
    assert registering.gfd()[CLIQUE] == EXPECTED["gpu.clique"]


async def test_gpus_that_disagree_on_their_clique_take_the_label_away(tray: Tray) -> None:
    await tray.becomes(lambda labels: CLIQUE in labels, "the clique")
    tray.edit(lambda doc: doc["gpus"][1]["fabric"].__setitem__("cliqueId", 7))
    await tray.becomes(lambda labels: CLIQUE not in labels, "no clique")
    assert tray.gfd()[COUNT] == "4"
