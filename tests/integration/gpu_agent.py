"""The agent on a simulated node, registered with the in-process kubelet stand-in: the
harness of the GPU acceptance tests (sharing, MIG, Allocate options)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agents.backends import Backends, simulated_backends
from agents.config import Config, parse_config
from agents.daemon import Agent, HealthReporter
from agents.families import parse_families
from agents.gpu.plan import GPU_RESOURCE
from agents.plugin.api import DevicePlugins
from agents.sim.bundled import bundled_node
from agents.sim.simnode import SimulatedNode
from agents.standin.kubelet import Kubelet
from agents.timing import PRODUCTION, Timing
from tests.conditions import WAIT

CONFIG_SOURCE = "gpu-test-config.yaml"


def run_gpu_agent_to_exit(*args: str) -> tuple[int, str]:
    """`node-agent run --families gpu ARGS` in a subprocess that should exit at once:
    (exit code, last line of stderr)."""
    with tempfile.TemporaryDirectory(prefix="dp-") as plugin_dir:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "agents.cli", "run", "--families", "gpu"),
                *("--device-plugin-dir", plugin_dir, *args),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    lines = done.stderr.strip().splitlines()
    return done.returncode, lines[-1] if lines else ""


@dataclass
class Running:
    agent: Agent
    kubelet: Kubelet
    backends: Backends
    node_file: Path

    @property
    def sim(self) -> SimulatedNode:
        assert self.backends.simulated is not None
        return self.backends.simulated

    def gpu_uuids(self) -> list[str]:
        """Physical GPU UUIDs in NVML index order."""
        return [g.uuid for g in self.sim.spec.gpus]

    def devices(self, resource: str = GPU_RESOURCE) -> dict[str, str]:
        """Device ID -> health, as the kubelet last heard it."""
        view = self.kubelet.resource(resource)
        return {} if view is None else {i: s.health for i, s in view.devices.items()}

    async def registered(self, counts: dict[str, int]) -> None:
        """Wait until the kubelet lists exactly these resources with these device counts."""
        await self.kubelet.wait_until(lambda k: k.capacity() == counts, WAIT)

    async def edit_node(self, change: Callable[[dict[str, Any]], object]) -> None:
        """Inject a fault: edit the node file with an atomic rename, as an operator would."""
        await asyncio.wait_for(self.sim.watching.wait(), WAIT)
        doc = yaml.safe_load(self.node_file.read_text())
        change(doc)
        tmp = self.node_file.with_name(".node.yaml.tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        tmp.replace(self.node_file)


def config(text: str) -> Config:
    return parse_config(text, CONFIG_SOURCE)


@contextlib.asynccontextmanager
async def running_agent(
    tmp_path: Path,
    cfg: Config | str = "",
    *,
    node: str | Path = "h100-8gpu-8nic",
    families: Sequence[str] = ("gpu",),
    reporter: HealthReporter | None = None,
    timing: Timing = PRODUCTION,
) -> AsyncIterator[Running]:
    """Kubelet stand-in up, agent started on a copy of the node file; both stopped after."""
    node_file = tmp_path / "node" / "node.yaml"
    node_file.parent.mkdir()
    shutil.copy(node if isinstance(node, Path) else bundled_node(node), node_file)
    # A unix socket path must fit in 108 bytes: pytest's tmp_path leaves too little room.
    plugin_dir = Path(tempfile.mkdtemp(prefix="dp-"))
    kubelet = Kubelet(plugin_dir, seed=11)
    await kubelet.start()
    stop = asyncio.Event()
    try:
        async with simulated_backends(node_file) as backends:
            parsed = config(cfg) if isinstance(cfg, str) else cfg
            agent = Agent(
                parsed,
                CONFIG_SOURCE,
                DevicePlugins(plugin_dir),
                backends,
                parse_families(",".join(families)),
                reporter=reporter,
                timing=timing,
            )
            await agent.start()
            task = asyncio.ensure_future(agent.run(stop))
            try:
                yield Running(agent, kubelet, backends, node_file)
            finally:
                stop.set()
                await asyncio.wait_for(task, WAIT)
    finally:
        await kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
