"""MIG through the kubelet stand-in: the mixed, none and single strategies on the bundled
MIG nodes, what Allocate names, and a fault on a MIG GPU reaching its instances."""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import structlog

from agents.core.health import GpuLost
from agents.errors import ConfigError
from agents.gpu.allocation import VISIBLE_DEVICES
from agents.gpu.family import GpuFamily
from agents.gpu.plan import GPU_RESOURCE
from agents.hw.nvidia_caps import access_files
from agents.sim.bundled import bundled_node
from agents.sim.node import load_node
from agents.sim.simnode import SimulatedNode
from agents.standin.kubelet import Container, Pod
from tests.conditions import WAIT, async_wait_until
from tests.families import gpu_family
from tests.integration.gpu_agent import config, run_gpu_agent_to_exit, running_agent
from tests.timing import SHORT

MIG_1G = "nvidia.com/mig-1g.10gb"
MIG_3G = "nvidia.com/mig-3g.40gb"
MIXED_NODE = "mig-mixed"  # GPU0: 3 x 1g.10gb + 1 x 3g.40gb; GPU1 whole
SINGLE_NODE = "mig-single"  # two GPUs of 7 x 1g.10gb each

MIXED = "version: v1\nflags:\n  migStrategy: mixed\n"
SINGLE = "version: v1\nflags:\n  migStrategy: single\n"
NONE = "version: v1\nflags:\n  migStrategy: none\n"

mixed_spec = load_node(bundled_node(MIXED_NODE))
MIG_GPU, WHOLE_GPU = mixed_spec.gpus
MIG_1G_UUIDS = {m.uuid for m in MIG_GPU.mig_instances if m.profile == "1g.10gb"}
MIG_3G_UUIDS = {m.uuid for m in MIG_GPU.mig_instances if m.profile == "3g.40gb"}


async def test_mixed_offers_one_resource_per_profile_and_the_whole_gpu(tmp_path: Path) -> None:
    async with running_agent(tmp_path, MIXED, node=MIXED_NODE) as run:
        await run.registered({MIG_1G: 3, MIG_3G: 1, GPU_RESOURCE: 1})
        assert set(run.devices(MIG_1G)) == MIG_1G_UUIDS
        assert set(run.devices(MIG_3G)) == MIG_3G_UUIDS
        assert set(run.devices(GPU_RESOURCE)) == {WHOLE_GPU.uuid}

        pod = Pod("mig", [Container("c", {MIG_1G: 2, MIG_3G: 1})])
        got = (await run.kubelet.admit(pod)).containers["c"]
        small = got.responses[MIG_1G].envs[VISIBLE_DEVICES].split(",")
        assert sorted(small) == sorted(got.devices[MIG_1G])
        assert set(small) <= MIG_1G_UUIDS
        assert got.responses[MIG_3G].envs[VISIBLE_DEVICES] == MIG_3G_UUIDS.pop()


def cap_devices(index: int) -> set[str]:
    """The capability devices of MIG_GPU's instance `index` (GPU instance `index`, compute
    instance 0), numbered as the driver numbers them: config 1, monitor 2, then 9 entries
    per GPU instance of each GPU minor (its access, then 8 compute instances')."""
    gi = 3 + MIG_GPU.minor * 135 + index * 9
    return {f"/dev/nvidia-caps/nvidia-cap{gi}", f"/dev/nvidia-caps/nvidia-cap{gi + 1}"}


async def test_pass_device_specs_gives_mig_instances_their_capability_devices(
    tmp_path: Path,
) -> None:
    async with running_agent(tmp_path, MIXED + "  passDeviceSpecs: true\n", node=MIXED_NODE) as run:
        await run.registered({MIG_1G: 3, MIG_3G: 1, GPU_RESOURCE: 1})
        pod = Pod("mig", [Container("c", {MIG_1G: 2, GPU_RESOURCE: 1})])
        got = (await run.kubelet.admit(pod)).containers["c"]
        index = {m.uuid: i for i, m in enumerate(MIG_GPU.mig_instances)}
        control = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
        want = control | {f"/dev/nvidia{MIG_GPU.minor}"}
        want |= {cap for uuid in got.devices[MIG_1G] for cap in cap_devices(index[uuid])}
        specs = got.responses[MIG_1G].devices
        assert {d.container_path for d in specs} == want
        assert len(specs) == len(want) == 4 + 2 * 2
        for spec in specs:
            assert spec.host_path == str(run.sim.dev_root) + spec.container_path
            # The simulator makes real character devices where it may (as root).
            assert stat.S_ISCHR(os.stat(spec.host_path).st_mode) or os.geteuid() != 0
        whole = {d.container_path for d in got.responses[GPU_RESOURCE].devices}
        assert whole == control | {f"/dev/nvidia{WHOLE_GPU.minor}"}


def test_an_unreadable_mig_access_file_costs_that_instance_its_caps_only(tmp_path: Path) -> None:
    node_file = tmp_path / "node.yaml"
    shutil.copy(bundled_node(MIXED_NODE), node_file)
    node = SimulatedNode(node_file, tmp_path / "root")
    node.load()
    broken = MIG_GPU.mig_instances[0]
    gone = access_files(MIG_GPU.minor, broken)[1]
    os.unlink(str(node.dev_root) + gone)
    cfg = config(MIXED + "  passDeviceSpecs: true\n")
    with structlog.testing.capture_logs() as logs:
        family = gpu_family(node.nvml, node.sysfs, cfg, dev_root=node.dev_root)
    [warning] = [e for e in logs if e["event"] == "mig_capabilities_unreadable"]
    assert (warning["mig"], warning["log_level"]) == (broken.uuid, "warning")
    assert gone in warning["error"]
    small = next(r for r in family.resources() if r.name == MIG_1G)
    paths = {
        uuid: {d.container_path for d in small.allocate([uuid]).nodes if "caps" in d.container_path}
        for uuid in MIG_1G_UUIDS
    }
    index = {m.uuid: i for i, m in enumerate(MIG_GPU.mig_instances)}
    assert paths == {u: set() if u == broken.uuid else cap_devices(index[u]) for u in MIG_1G_UUIDS}
    node.links.close()


async def test_time_slicing_a_mig_profile_replicates_its_instances(tmp_path: Path) -> None:
    cfg = MIXED + (
        "sharing:\n  timeSlicing:\n    resources:\n"
        "      - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n"
    )
    async with running_agent(tmp_path, cfg, node=MIXED_NODE) as run:
        await run.registered({MIG_1G: 6, MIG_3G: 1, GPU_RESOURCE: 1})
        assert set(run.devices(MIG_1G)) == {f"{u}::{n}" for u in MIG_1G_UUIDS for n in (0, 1)}
        mig = sorted(MIG_1G_UUIDS)[0]
        endpoint = run.kubelet.endpoint(MIG_1G)
        assert endpoint is not None
        answer = await endpoint.allocate([f"{mig}::0", f"{mig}::1"])
        assert answer.envs[VISIBLE_DEVICES] == mig


async def test_none_offers_the_mig_gpu_as_a_whole_gpu(tmp_path: Path) -> None:
    async with running_agent(tmp_path, NONE, node=MIXED_NODE) as run:
        await run.registered({GPU_RESOURCE: 2})
        assert set(run.devices()) == {MIG_GPU.uuid, WHOLE_GPU.uuid}


async def test_single_on_a_node_with_a_whole_gpu_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        async with running_agent(tmp_path, SINGLE, node=MIXED_NODE):
            pass
    assert err.value.key == "flags.migStrategy"
    assert WHOLE_GPU.uuid in str(err.value)


def test_single_on_a_node_with_a_whole_gpu_exits_2_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(SINGLE)
    code, last = run_gpu_agent_to_exit(
        *("--config", str(config), "--simulate", str(bundled_node(MIXED_NODE)))
    )
    assert code == 2, last
    assert last.startswith(f"node-agent: {config}: flags.migStrategy: "), last


async def test_single_with_one_profile_offers_mig_instances_as_gpus(tmp_path: Path) -> None:
    spec = load_node(bundled_node(SINGLE_NODE))
    instances = {m.uuid for g in spec.gpus for m in g.mig_instances}
    async with running_agent(tmp_path, SINGLE, node=SINGLE_NODE) as run:
        await run.registered({GPU_RESOURCE: 14})
        assert set(run.devices()) == instances
        view = run.kubelet.resource(GPU_RESOURCE)
        assert view is not None
        numa = {m.uuid: g.numa for g in spec.gpus for m in g.mig_instances}
        assert all(state.numa == (numa[i],) for i, state in view.devices.items())
        got = await run.kubelet.admit(Pod("p", [Container("c", {GPU_RESOURCE: 3})]))
        env = got.containers["c"].responses[GPU_RESOURCE].envs[VISIBLE_DEVICES]
        assert sorted(env.split(",")) == sorted(got.devices("c", GPU_RESOURCE))
        assert set(env.split(",")) <= instances


def _xid(doc: dict[str, Any]) -> None:
    doc["gpus"][0]["xids"].append(79)


def _lost(doc: dict[str, Any]) -> None:
    doc["gpus"][0]["lost"] = True


def _answering(doc: dict[str, Any]) -> None:
    doc["gpus"][0]["lost"] = False


@pytest.mark.parametrize("fault", [_xid, _lost], ids=["xid-79", "lost"])
async def test_a_fault_on_the_mig_gpu_turns_its_instances_unhealthy(
    tmp_path: Path, fault: Callable[[dict[str, Any]], None]
) -> None:
    async with running_agent(tmp_path, MIXED, node=MIXED_NODE, timing=SHORT) as run:
        await run.registered({MIG_1G: 3, MIG_3G: 1, GPU_RESOURCE: 1})
        await run.edit_node(fault)
        await run.kubelet.wait_until(
            lambda k: k.allocatable() == {MIG_1G: 0, MIG_3G: 0, GPU_RESOURCE: 1}, WAIT
        )
        assert run.devices(GPU_RESOURCE) == {WHOLE_GPU.uuid: "Healthy"}

        # A reset GPU (lost, then answering again): its instances come back after the
        # hold time. Taking an XID out of the file alone heals nothing, as on real NVML.
        gpu = run.agent.family(GpuFamily)
        assert gpu is not None
        uuid = run.gpu_uuids()[0]
        await run.edit_node(_lost)
        await async_wait_until(lambda: gpu.unhealthy_cause(uuid) == GpuLost(), WAIT, "lost")
        await run.edit_node(_answering)
        await run.kubelet.wait_until(
            lambda k: k.allocatable() == {MIG_1G: 3, MIG_3G: 1, GPU_RESOURCE: 1},
            WAIT + SHORT.gpu_hold_s,
        )
