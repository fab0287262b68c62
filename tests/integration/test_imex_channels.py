"""IMEX channels on a simulated node, through the kubelet stand-in: a node whose channel
exists hands it to every GPU container; a required channel that is missing stops the
agent at start (exit 2) and is refused on reload, the running config kept."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from agents.errors import ConfigError
from agents.gpu.plan import GPU_RESOURCE
from agents.sim.bundled import bundled_node
from agents.standin.kubelet import Container, Pod
from tests.integration.gpu_agent import config, run_gpu_agent_to_exit, running_agent

CHANNEL = "/dev/nvidia-caps-imex-channels/channel0"
REQUIRED = "imex: {channelIDs: [0], required: true}\n"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a char device")


def node_with_channel(tmp_path: Path) -> Path:
    doc = yaml.safe_load(bundled_node("h100-8gpu-8nic").read_text())
    doc["imex"] = {"channels": [0]}
    path = tmp_path / "imex-node.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@needs_root
@pytest.mark.parametrize("count", [1, 2])
async def test_every_gpu_container_gets_the_channel(tmp_path: Path, count: int) -> None:
    cfg = REQUIRED + "flags: {passDeviceSpecs: true}\n"
    async with running_agent(tmp_path, cfg, node=node_with_channel(tmp_path)) as run:
        await run.registered({GPU_RESOURCE: 8})
        got = await run.kubelet.admit(Pod("p", [Container("c", {GPU_RESOURCE: count})]))
        answer = got.containers["c"].responses[GPU_RESOURCE]
        assert answer.envs["NVIDIA_IMEX_CHANNELS"] == "0"
        assert len(answer.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == count
        [spec] = [d for d in answer.devices if d.container_path == CHANNEL]
        assert spec.host_path == str(run.sim.dev_root) + CHANNEL
        assert stat.S_ISCHR(os.stat(spec.host_path).st_mode)


async def test_a_missing_channel_not_required_gives_none(tmp_path: Path) -> None:
    async with running_agent(tmp_path, "imex: {channelIDs: [0]}\n") as run:
        await run.registered({GPU_RESOURCE: 8})
        got = await run.kubelet.admit(Pod("p", [Container("c", {GPU_RESOURCE: 1})]))
        assert "NVIDIA_IMEX_CHANNELS" not in got.containers["c"].responses[GPU_RESOURCE].envs


async def test_a_required_channel_missing_on_reload_keeps_the_running_config(
    tmp_path: Path,
) -> None:
    async with running_agent(tmp_path, "imex: {channelIDs: [0]}\n") as run:
        await run.registered({GPU_RESOURCE: 8})
        before = run.agent.config
        with pytest.raises(ConfigError, match=r"imex\.channelIDs: IMEX channel 0 on this node"):
            await run.agent.reload(config(REQUIRED))
        assert run.agent.config is before
        got = await run.kubelet.admit(Pod("p", [Container("c", {GPU_RESOURCE: 1})]))
        assert got.devices("c", GPU_RESOURCE)


def test_a_required_channel_missing_at_start_exits_2_naming_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(REQUIRED)
    node = bundled_node("h100-8gpu-8nic")
    code, last = run_gpu_agent_to_exit("--simulate", str(node), "--config", str(cfg))
    assert code == 2, last
    assert f"imex.channelIDs: IMEX channel 0 on this node (imex.required), found no {CHANNEL}" in (
        last
    )
