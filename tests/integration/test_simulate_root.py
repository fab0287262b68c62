"""`node-agent run --simulate --simulate-root DIR` as a process: every device path that
Allocate hands the kubelet is a character device under DIR, which outlives the agent."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

from agents.sim.root import SUBTREE
from agents.standin.kubelet import Container, Kubelet, Pod
from tests.conditions import WAIT
from tests.integration.conftest import AgentProcess

GPU = "nvidia.com/gpu"
NIC = "rdma/roce"

StartAgent = Callable[[Sequence[str]], AgentProcess]


def _everything_listed(k: Kubelet) -> bool:
    return k.allocatable().get(GPU) == 8 and k.allocatable().get(NIC) == 8


async def test_allocate_hands_out_character_devices_under_the_simulate_root(
    start_agent: StartAgent, kubelet: Kubelet, plugin_dir: Path, node_file: Path, tmp_path: Path
) -> None:
    root = tmp_path / "sim-root"
    root.mkdir()
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags:\n  passDeviceSpecs: true\n")
    agent = start_agent(
        [
            "run",
            *("--simulate", str(node_file), "--simulate-root", str(root)),
            *("--config", str(config), "--device-plugin-dir", str(plugin_dir)),
        ]
    )
    await kubelet.wait_until(lambda k: _everything_listed(k) or not agent.alive(), WAIT)
    assert agent.alive(), agent.stderr

    got = (await kubelet.admit(Pod("p", [Container("c", {GPU: 2, NIC: 2})]))).containers["c"]

    specs = [d for r in (GPU, NIC) for d in got.responses[r].devices]
    assert {d.container_path for d in specs} >= {"/dev/nvidiactl", "/dev/infiniband/rdma_cm"}
    for spec in specs:
        assert spec.host_path == f"{root}/{SUBTREE}{spec.container_path}"
        assert stat.S_ISCHR(os.lstat(spec.host_path).st_mode), spec.host_path
    assert agent.terminate() == 0
    assert root.is_dir() and os.listdir(root) == []


def test_a_simulate_root_that_is_a_file_exits_2_naming_it(
    start_agent: StartAgent, plugin_dir: Path, tmp_path: Path
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.touch()
    agent = start_agent(
        [
            "run",
            *("--simulate", "h100-8gpu-8nic", "--simulate-root", str(not_a_dir)),
            *("--device-plugin-dir", str(plugin_dir)),
        ]
    )
    assert agent.process.wait(WAIT) == 2
    assert f"node-agent: {not_a_dir}: --simulate-root: a directory" in agent.stderr
