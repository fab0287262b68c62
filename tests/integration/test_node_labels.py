"""The NFD feature file of a running agent: written on start with the node's labels,
rewritten when a device turns Unhealthy and again when it recovers, always atomically."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.backends import simulated_backends
from agents.config import Config
from agents.core.fabric_place import LEAF_GROUP
from agents.core.health import Cause, GpuLost
from agents.daemon import Agent
from agents.gpu.family import GpuFamily
from agents.plugin.api import DevicePlugins
from agents.sim.bundled import bundled_node
from tests.conditions import WAIT, async_wait_until
from tests.families import running_family
from tests.timing import SHORT

PREFIX = "node-agents.io/"
VALID_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
KEYS = {
    PREFIX + key
    for key in (
        "gpu.count",
        "gpu.healthy",
        "gpu.memory",
        "gpu.mig.capable",
        "gpu.product",
        "roce.count",
        "roce.healthy",
        "gpu-nic.pairs",
    )
} | {LEAF_GROUP}  # the bundled node's NICs hear two leaf switches


def parse(text: str) -> dict[str, str]:
    """A feature file's labels but GFD's (tests/integration/test_gfd_labels.py); fails on
    anything but complete key=value lines."""
    assert text.endswith("\n"), f"truncated file: {text!r}"
    lines = dict(line.split("=", 1) for line in text.splitlines())
    labels = {k: v for k, v in lines.items() if not k.startswith("nvidia.com/")}
    assert set(labels) == KEYS, f"incomplete file: {text!r}"
    return labels


@dataclass
class Labelled:
    agent: Agent
    node_file: Path
    features: Path

    def labels(self) -> dict[str, str]:
        return parse(self.features.read_text()) if self.features.exists() else {}

    async def label_becomes(self, key: str, value: str) -> None:
        await async_wait_until(
            lambda: self.labels().get(PREFIX + key) == value, WAIT, f"{key}={value}"
        )

    def edit_node(self, change: Callable[[dict[str, Any]], None]) -> None:
        """Inject a fault: edit the node file with an atomic rename, as an operator would."""
        doc = yaml.safe_load(self.node_file.read_text())
        change(doc)
        tmp = self.node_file.with_name(".node.yaml.tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        tmp.replace(self.node_file)


@pytest.fixture
async def labelled(tmp_path: Path, plugin_dir: Path) -> AsyncIterator[Labelled]:
    """The agent (every family) on the bundled 8-GPU, 8-NIC node, writing its feature file."""
    node_file = tmp_path / "node" / "node.yaml"
    node_file.parent.mkdir()
    shutil.copy(bundled_node("h100-8gpu-8nic"), node_file)
    features = tmp_path / "features.d" / "node-agents"
    stop = asyncio.Event()
    async with simulated_backends(node_file) as backends:
        agent = Agent(
            Config.default(),
            "<defaults>",
            DevicePlugins(plugin_dir),
            backends,
            nfd_features_file=features,
            timing=SHORT,
        )
        await agent.start()
        task = asyncio.ensure_future(agent.run(stop))
        try:
            assert backends.simulated is not None
            await asyncio.wait_for(backends.simulated.watching.wait(), WAIT)
            yield Labelled(agent, node_file, features)
        finally:
            stop.set()
            await asyncio.wait_for(task, WAIT)


async def test_feature_file_describes_the_node_on_start(labelled: Labelled) -> None:
    await labelled.label_becomes("roce.healthy", "8")
    labels = labelled.labels()
    assert labels == {
        PREFIX + "gpu.count": "8",
        PREFIX + "gpu.healthy": "8",
        PREFIX + "gpu.memory": "81559",
        PREFIX + "gpu.mig.capable": "false",
        PREFIX + "gpu.product": "NVIDIA-H100-80GB-HBM3",
        PREFIX + "roce.count": "8",
        PREFIX + "roce.healthy": "8",
        PREFIX + "gpu-nic.pairs": "true",
        LEAF_GROUP: "leaf-a.leaf-b",
    }
    for key, value in labels.items():
        assert len(key.partition("/")[2]) <= 63
        assert len(value) <= 63 and VALID_VALUE.match(value), f"{key}={value!r}"
    # NFD reads every file of the directory: only ours may be there, readable by it.
    assert [p.name for p in labelled.features.parent.iterdir()] == ["node-agents"]
    assert labelled.features.stat().st_mode & 0o777 == 0o644


async def test_gpu_fault_and_recovery_rewrite_the_healthy_count(labelled: Labelled) -> None:
    await labelled.label_becomes("gpu.healthy", "8")
    labelled.edit_node(lambda node: node["gpus"][2]["xids"].append(79))
    await labelled.label_becomes("gpu.healthy", "7")
    assert labelled.labels()[PREFIX + "gpu.count"] == "8"

    # Healthy again after a reset (lost, then answering), not by taking the XID out.
    uuid = running_family(labelled.agent, GpuFamily).gpus[2].uuid
    labelled.edit_node(lambda node: node["gpus"][2].__setitem__("lost", True))
    await async_wait_until(lambda: _cause(labelled, uuid) == GpuLost(), WAIT, "lost")
    labelled.edit_node(lambda node: node["gpus"][2].__setitem__("lost", False))
    await async_wait_until(
        lambda: labelled.labels().get(PREFIX + "gpu.healthy") == "8",
        WAIT + SHORT.gpu_hold_s,
        "healthy",
    )


def _cause(labelled: Labelled, uuid: str) -> Cause | None:
    return running_family(labelled.agent, GpuFamily).unhealthy_cause(uuid)


async def test_nic_link_down_rewrites_the_roce_healthy_count(labelled: Labelled) -> None:
    await labelled.label_becomes("roce.healthy", "8")
    labelled.edit_node(lambda node: node["nics"][5].__setitem__("link", "down"))
    await labelled.label_becomes("roce.healthy", "7")
    assert labelled.labels()[PREFIX + "roce.count"] == "8"


@dataclass
class Reader:
    """Reads the feature file in a loop from another thread, as NFD's worker would."""

    path: Path
    seen: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(FileNotFoundError):
                self.seen.append(self.path.read_text())
            self.stop.wait(0.001)  # pacing, not synchronisation: leave the agent some CPU


@pytest.fixture
def reader(labelled: Labelled) -> Iterator[Reader]:
    reading = Reader(labelled.features)
    thread = threading.Thread(target=reading.run, daemon=True)
    thread.start()
    yield reading
    reading.stop.set()
    thread.join(WAIT)


async def test_readers_only_ever_see_whole_files_and_no_temp_files_remain(
    labelled: Labelled, reader: Reader
) -> None:
    await labelled.label_becomes("gpu.healthy", "8")
    for n in range(3):  # three rewrites: one more GPU with an XID each time

        def xid(node: dict[str, Any], n: int = n) -> None:
            node["gpus"][5 + n]["xids"].append(79)

        labelled.edit_node(xid)
        await labelled.label_becomes("gpu.healthy", str(7 - n))
    last = f"{PREFIX}gpu.healthy=5"
    await async_wait_until(lambda: any(last in text for text in reader.seen), WAIT, "read")
    reader.stop.set()

    healthy = [parse(text)[PREFIX + "gpu.healthy"] for text in reader.seen]
    assert {"5", "6", "7", "8"} <= set(healthy)
    assert [p.name for p in labelled.features.parent.iterdir()] == ["node-agents"]
