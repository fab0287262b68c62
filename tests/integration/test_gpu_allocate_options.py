"""What the GPU flags change, through the kubelet stand-in: deviceListStrategy,
deviceIDStrategy, passDeviceSpecs, failOnInitError, the XID policy, and the
best-connected choice of several whole GPUs."""

from __future__ import annotations

import asyncio
import os
import shutil
import stat
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

from agents.backends import Backends
from agents.config import Config
from agents.core.topology import Distance, distance
from agents.daemon import Agent
from agents.errors import BackendError
from agents.families import parse_families
from agents.gpu.allocation import VISIBLE_DEVICES
from agents.gpu.discovery import Gpu
from agents.gpu.family import GpuFamily
from agents.gpu.plan import GPU_RESOURCE
from agents.hw.nvml_backend import NvmlBackend
from agents.plugin.api import DevicePlugins
from agents.sim.bundled import bundled_node
from agents.sim.simnode import SimulatedNode
from agents.standin.kubelet import Container, Kubelet, Pod
from tests.conditions import WAIT
from tests.families import running_family
from tests.integration.gpu_agent import Running, config, run_gpu_agent_to_exit, running_agent

NIC_RESOURCE = "rdma/roce"
GPUS = 8


def nvml_is_missing() -> bool:
    backend = NvmlBackend()
    try:
        backend.init()
    except BackendError:
        return True
    backend.shutdown()
    return False


needs_no_nvml = pytest.mark.skipif(
    not nvml_is_missing(), reason="NVML initialises here: this checks a node without it"
)


async def admit(run: Running, pod: str, count: int) -> tuple[list[str], Any]:
    """Admit one container asking for `count` GPUs: (device IDs, Allocate answer)."""
    got = await run.kubelet.admit(Pod(pod, [Container("c", {GPU_RESOURCE: count})]))
    return got.devices("c", GPU_RESOURCE), got.containers["c"].responses[GPU_RESOURCE]


# With cdi-cri alone the answer carries no NVIDIA_VISIBLE_DEVICES: the runtime injects
# the devices from the CDI spec, and the env var as well would have a legacy runtime
# hook inject them a second time. Listing envvar too asks for both, explicitly.
@pytest.mark.parametrize(
    ("strategy", "want_env", "want_cdi"),
    [("envvar", True, False), ("[envvar, cdi-cri]", True, True), ("cdi-cri", False, True)],
    ids=["envvar", "envvar+cdi-cri", "cdi-cri-alone"],
)
async def test_device_list_strategy_chooses_env_and_cdi_names(
    tmp_path: Path, strategy: str, want_env: bool, want_cdi: bool
) -> None:
    cfg = f"version: v1\nflags:\n  deviceListStrategy: {strategy}\n"
    async with running_agent(tmp_path, cfg) as run:
        await run.registered({GPU_RESOURCE: GPUS})
        ids, answer = await admit(run, "p", 2)
        env = answer.envs.get(VISIBLE_DEVICES)
        assert (sorted(env.split(",")) if want_env else env) == (sorted(ids) if want_env else None)
        cdi = sorted(d.name for d in answer.cdi_devices)
        assert cdi == (sorted(f"nvidia.com/gpu={u}" for u in ids) if want_cdi else [])


async def test_index_strategy_keeps_uuid_ids_and_tells_the_container_indices(
    tmp_path: Path,
) -> None:
    cfg = "version: v1\nflags:\n  plugin:\n    deviceIDStrategy: index\n"
    async with running_agent(tmp_path, cfg) as run:
        await run.registered({GPU_RESOURCE: GPUS})
        uuids = run.gpu_uuids()
        assert set(run.devices()) == set(uuids)
        ids, answer = await admit(run, "p", 3)
        told = answer.envs[VISIBLE_DEVICES].split(",")
        assert sorted(told) == sorted(str(uuids.index(i)) for i in ids)


async def test_pass_device_specs_gives_control_and_gpu_nodes_under_the_dev_root(
    tmp_path: Path,
) -> None:
    async with running_agent(tmp_path, "version: v1\nflags:\n  passDeviceSpecs: true\n") as run:
        await run.registered({GPU_RESOURCE: GPUS})
        ids, answer = await admit(run, "p", 2)
        minors = {g.uuid: g.minor for g in run.sim.spec.gpus}
        expected = {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}
        expected |= {f"/dev/nvidia{minors[u]}" for u in ids}
        assert {d.container_path for d in answer.devices} == expected
        for spec in answer.devices:
            assert spec.host_path == str(run.sim.dev_root) + spec.container_path
            assert spec.permissions == "rw"
            mode = os.stat(spec.host_path).st_mode
            # The simulator makes real character devices where it may (as root).
            assert stat.S_ISCHR(mode) or os.geteuid() != 0, spec.host_path


async def test_without_pass_device_specs_no_device_nodes_are_passed(tmp_path: Path) -> None:
    async with running_agent(tmp_path) as run:
        await run.registered({GPU_RESOURCE: GPUS})
        _, answer = await admit(run, "p", 1)
        assert list(answer.devices) == []


@pytest.fixture
async def node_without_nvml(tmp_path: Path) -> AsyncIterator[SimulatedNode]:
    """Sysfs and links of the bundled node; NVML is the real one, which has no library."""
    node_file = tmp_path / "node.yaml"
    shutil.copy(bundled_node("h100-8gpu-8nic"), node_file)
    node = SimulatedNode(node_file, tmp_path / "root")
    node.load()
    yield node
    node.links.close()


@needs_no_nvml
async def test_fail_on_init_error_false_serves_roce_without_gpus(
    node_without_nvml: SimulatedNode,
) -> None:
    node = node_without_nvml
    backends = Backends(NvmlBackend(), node.sysfs, node.links, node.dev_root)
    cfg = config("version: v1\nflags:\n  failOnInitError: false\n")
    plugin_dir = Path(tempfile.mkdtemp(prefix="dp-"))
    kubelet = Kubelet(plugin_dir, seed=5)
    await kubelet.start()
    stop = asyncio.Event()
    try:
        with structlog.testing.capture_logs() as logs:
            agent = Agent(cfg, "cfg.yaml", DevicePlugins(plugin_dir), backends)
            await agent.start()
        task = asyncio.ensure_future(agent.run(stop))
        try:
            await kubelet.wait_until(lambda k: k.capacity() == {NIC_RESOURCE: 8}, WAIT)
            got = await kubelet.admit(Pod("p", [Container("c", {NIC_RESOURCE: 1})]))
            assert len(got.devices("c", NIC_RESOURCE)) == 1
        finally:
            stop.set()
            await asyncio.wait_for(task, WAIT)
    finally:
        await kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
    gpu_lines = [e for e in logs if "gpu" in e["event"] or "nvml" in e["event"]]
    assert [e["event"] for e in gpu_lines] == ["gpu_family_disabled"]
    assert "NVML" in gpu_lines[0]["reason"]
    assert running_family(agent, GpuFamily).resources() == []


@needs_no_nvml
async def test_fail_on_init_error_true_raises_backend_error(
    node_without_nvml: SimulatedNode,
) -> None:
    node = node_without_nvml
    backends = Backends(NvmlBackend(), node.sysfs, node.links, node.dev_root)
    agent = Agent(
        Config.default(),
        "<defaults>",
        DevicePlugins(Path("/nonexistent")),
        backends,
        parse_families("gpu"),
    )
    with pytest.raises(BackendError, match="NVML unavailable"):
        await agent.start()


@needs_no_nvml
def test_fail_on_init_error_true_makes_run_exit_1_with_a_clear_message() -> None:
    code, last = run_gpu_agent_to_exit()
    assert code == 1, last
    assert last.startswith("node-agent: NVML unavailable: "), last


APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)


@pytest.mark.parametrize(
    ("disabled", "xids", "healthy"),
    [
        ("[]", [48], False),
        ("[48]", [48], True),
        ("[48, 94]", [94, 48], True),
        ("[48]", [48, 63], False),
        *(("[]", [x], True) for x in APPLICATION_XIDS),
        ("[]", list(APPLICATION_XIDS), True),
    ],
    ids=[
        "48-critical-by-default",
        "48-disabled",
        "two-disabled",
        "disabled-and-critical",
        *(f"application-xid-{x}" for x in APPLICATION_XIDS),
        "all-application-xids",
    ],
)
async def test_xid_policy_decides_whether_a_gpu_turns_unhealthy(
    tmp_path: Path, disabled: str, xids: list[int], healthy: bool
) -> None:
    cfg = f"version: v1\nhealth:\n  disabledXids: {disabled}\n"
    async with running_agent(tmp_path, cfg) as run:
        await run.registered({GPU_RESOURCE: GPUS})
        uuids = run.gpu_uuids()

        def inject(doc: dict[str, Any]) -> None:
            doc["gpus"][2]["xids"].extend(xids)
            doc["gpus"][3]["xids"].append(79)  # a barrier: seen in the same refresh

        await run.edit_node(inject)
        await run.kubelet.wait_until(lambda _: run.devices()[uuids[3]] == "Unhealthy", WAIT)
        assert run.devices()[uuids[2]] == ("Healthy" if healthy else "Unhealthy")


def pcie_distance(gpus: list[Gpu], a: str, b: str) -> Distance:
    by_uuid = {g.uuid: g.location for g in gpus}
    la, lb = by_uuid[a], by_uuid[b]
    assert la is not None and lb is not None
    return distance(la, lb)


async def test_two_gpus_preferred_share_a_pcie_switch_when_nvlinks_tie(tmp_path: Path) -> None:
    # Full NVLink mesh, one link per pair; two GPUs per PCIe switch.
    async with running_agent(tmp_path, node="h100-8gpu-4nic") as run:
        await run.registered({GPU_RESOURCE: GPUS})
        gpus = running_family(run.agent, GpuFamily).gpus
        for n in range(GPUS // 2):
            ids, _ = await admit(run, f"p{n}", 2)
            assert pcie_distance(gpus, *ids) == Distance.PIX, ids
        assert len(run.kubelet.allocated()[GPU_RESOURCE]) == GPUS


async def test_must_include_gpu_gets_its_switch_mate(tmp_path: Path) -> None:
    async with running_agent(tmp_path, node="h100-8gpu-4nic") as run:
        await run.registered({GPU_RESOURCE: GPUS})
        uuids = run.gpu_uuids()
        endpoint = run.kubelet.endpoint(GPU_RESOURCE)
        assert endpoint is not None
        answer = await endpoint.preferred(list(reversed(uuids)), [uuids[5]], 2)
        assert sorted(answer) == sorted([uuids[4], uuids[5]])


async def test_more_nvlinks_outweigh_a_shared_pcie_switch(tmp_path: Path) -> None:
    doc = yaml.safe_load(bundled_node("h100-8gpu-4nic").read_text())
    gpu0, gpu5 = doc["gpus"][0], doc["gpus"][5]
    gpu0["nvlinks"].append(gpu5["uuid"])  # a second link between GPU0 and GPU5 (SYS apart)
    gpu5["nvlinks"].append(gpu0["uuid"])
    node = tmp_path / "nvlink-pair.yaml"
    node.write_text(yaml.safe_dump(doc, sort_keys=False))
    async with running_agent(tmp_path, node=node) as run:
        await run.registered({GPU_RESOURCE: GPUS})
        gpus = running_family(run.agent, GpuFamily).gpus
        ids, _ = await admit(run, "p", 2)
        assert sorted(ids) == sorted([gpu0["uuid"], gpu5["uuid"]])
        assert pcie_distance(gpus, *ids) == Distance.SYS
        ids, _ = await admit(run, "q", 2)  # the rest of the mesh ties: a switch pair again
        assert pcie_distance(gpus, *ids) == Distance.PIX
