"""What the GPU and RoCE families publish for DRA on the bundled simulated nodes: valid,
unique names, the attribute limits, the exact attributes of a GPU, a MIG instance and a
NIC, the switch and root attributes against the node file, taints, and named_devices."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from agents.config import Config, Flags, Imex, Roce, Sharing, TimeSlicedResource, TimeSlicing
from agents.core.health import GpuLost, LinkNotUp, NvmlError, NvmlHung, Taint, Xids
from agents.gpu import dra as gpu_dra
from agents.gpu.dra import binary_quantity, semantic
from agents.gpu.kind import GpuKind
from agents.kernel.facts import (
    NUMA_NODE,
    PCI_BUS_ID,
    PCIE_ROOT,
    PCIE_SWITCH,
    DeviceFacts,
    Version,
)
from agents.roce import dra as roce_dra
from agents.roce.kind import RoceKind
from agents.sim.bundled import bundled_node, bundled_nodes
from agents.sim.simnode import SimulatedNode
from tests.families import gpu_family, roce_family

DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _published(
    name: str, tmp_path: Path
) -> tuple[SimulatedNode, list[DeviceFacts], list[DeviceFacts]]:
    node = SimulatedNode(bundled_node(name), tmp_path)
    node.load()
    gpus = gpu_family(
        node.nvml, node.sysfs, GpuKind().named_devices(Config.default()), dev_root=node.dev_root
    )
    nics = roce_family(node.sysfs, node.links, RoceKind().named_devices(Config.default()))
    return node, list(gpus.facts().devices), list(nics.facts().devices)


def check_devices(devices: list[DeviceFacts]) -> None:
    """The limits the API server holds a ResourceSlice's devices to."""
    names = [d.name for d in devices]
    assert len(names) == len(set(names))
    for device in devices:
        assert len(device.name) <= 63 and DNS_LABEL.fullmatch(device.name), device.name
        assert len(device.attributes) + len(device.capacity) <= 32
        for value in device.attributes.values():
            if isinstance(value, str):
                assert len(value) <= 64
            if isinstance(value, Version):
                assert len(value.value) <= 64


@pytest.mark.parametrize("name", bundled_nodes())
def test_every_bundled_node_publishes_valid_devices_placed_as_its_file_says(
    name: str, tmp_path: Path
) -> None:
    node, gpus, nics = _published(name, tmp_path)
    check_devices(gpus)
    check_devices(nics)
    served = {g.uuid for g in node.spec.gpus if not g.mig_enabled}
    served |= {m.uuid for g in node.spec.gpus if g.mig_enabled for m in g.mig_instances}
    assert {d.device_id for d in gpus} == served
    assert {d.device_id for d in nics} == {n.pci for n in node.spec.nics}
    upstream = {g.uuid: g.upstream for g in node.spec.gpus}
    upstream |= {m.uuid: g.upstream for g in node.spec.gpus for m in g.mig_instances}
    upstream |= {n.pci: n.upstream for n in node.spec.nics}
    for device in gpus + nics:
        bridges = upstream[device.device_id]
        if bridges:  # pci<domain>:<bus> of the root port
            assert device.attributes[PCIE_ROOT] == "pci" + bridges[0][:7]
        # A switch between root port and device: the root port, else nothing.
        assert device.attributes.get(PCIE_SWITCH) == (bridges[0] if len(bridges) >= 2 else None)


def test_a_whole_gpu_mig_instances_and_a_nic_carry_exactly_these_attributes(
    tmp_path: Path,
) -> None:
    _, gpus, _ = _published("mig-mixed", tmp_path)
    by_name = {d.name: d for d in gpus}
    assert sorted(by_name) == [
        "gpu-0-mig-1g10gb-19-0",
        "gpu-0-mig-1g10gb-19-1",
        "gpu-0-mig-1g10gb-19-2",
        "gpu-0-mig-3g40gb-9-3",
        "gpu-1",
    ]
    parent = "GPU-5e7a1c42-8d0b-5f3e-9a61-2c4b7d9e0f13"
    common = {
        "productName": "NVIDIA H100 80GB HBM3",
        "brand": "Nvidia",
        "architecture": "Hopper",
        "cudaComputeCapability": Version("9.0.0"),
        "driverVersion": Version("550.54.15"),
        "cudaDriverVersion": Version("12.4.0"),
        PCIE_ROOT: "pci0000:15",
        NUMA_NODE: 0,
        PCIE_SWITCH: "0000:15:01.0",
    }
    whole = by_name["gpu-1"]
    assert (whole.resource, whole.device_id) == (
        "nvidia.com/gpu",
        "GPU-a93f0d27-64c1-5b8e-8e2d-71f5c3b6a048",
    )
    assert whole.attributes == {
        "type": "gpu",
        "uuid": "GPU-a93f0d27-64c1-5b8e-8e2d-71f5c3b6a048",
        **common,
        PCI_BUS_ID: "0000:19:00.0",
    }
    assert whole.capacity == {"memory": "81559Mi"}
    mig = by_name["gpu-0-mig-3g40gb-9-3"]
    uuid = "MIG-3f4a5b6c-7d8e-5f90-a1b2-c34d5e6f7081"
    assert (mig.resource, mig.device_id) == ("nvidia.com/mig-3g.40gb", uuid)
    assert mig.attributes == {
        "type": "mig",
        "uuid": uuid,
        "parentUUID": parent,
        "profile": "3g.40gb",
        **common,
        PCI_BUS_ID: "0000:18:00.0",
    }
    assert mig.capacity == {
        "multiprocessors": "48",
        "copyEngines": "3",
        "decoders": "2",
        "encoders": "0",
        "jpegEngines": "0",
        "ofaEngines": "0",
        "memory": str(81559 * 4 // 8) + "Mi",
        **{f"memorySlice{i}": "1" for i in range(3, 7)},
    }


def test_a_nic_carries_its_interface_rdma_device_and_place(tmp_path: Path) -> None:
    node, _, nics = _published("h100-8gpu-4nic", tmp_path)
    spec = node.spec.nics[0]
    nic = next(d for d in nics if d.device_id == spec.pci)
    assert nic.name == "nic-" + spec.pci.replace(":", "-").replace(".", "-")
    assert nic.resource == "rdma/roce"
    expected: dict[str, object] = {
        "ifName": spec.netdev,
        "rdmaDevice": spec.rdma,
        PCI_BUS_ID: spec.pci,
        PCIE_ROOT: "pci" + spec.upstream[0][:7],
    }
    if spec.numa is not None:
        expected[NUMA_NODE] = spec.numa
    if len(spec.upstream) >= 2:
        expected[PCIE_SWITCH] = spec.upstream[0]
    assert nic.attributes == expected


def test_taints_say_why_a_device_is_unhealthy() -> None:
    gpu, nic = gpu_dra.DRIVER, roce_dra.DRIVER
    assert Xids((79,)).taint(gpu) == Taint("gpu.nvidia.com/xid", "79")
    assert Xids((48, 79)).taint(gpu) == Taint("gpu.nvidia.com/xid", "48")
    assert GpuLost().taint(gpu) == Taint("gpu.nvidia.com/gpu-lost")
    assert NvmlHung().taint(gpu) == Taint("gpu.nvidia.com/unhealthy", "hung")
    assert NvmlError("Unknown").taint(gpu) == Taint("gpu.nvidia.com/unhealthy", "nvml-Unknown")
    assert LinkNotUp("down").taint(nic) == Taint("roce.node-agents.io/link-down")


def test_versions_and_quantities_read_as_the_api_server_expects() -> None:
    assert semantic("550.163.01") == Version("550.163.1")
    assert semantic("12.4") == Version("12.4.0")
    assert semantic("r550") is None
    assert binary_quantity(40 * 2**30) == "40Gi"
    assert binary_quantity(4864 * 2**20) == "4864Mi"
    assert binary_quantity(1) == "1"


def test_named_devices_sets_back_what_claims_decide_and_warns_once_for_each() -> None:
    config = Config(
        flags=Flags(
            mig_strategy="single",
            device_id_strategy="index",
            device_list_strategy=frozenset({"cdi-cri"}),
            pass_device_specs=True,
        ),
        sharing=Sharing(TimeSlicing(resources=(TimeSlicedResource("nvidia.com/gpu", 4),))),
        roce=Roce(resource_name="rdma/fast"),
        imex=Imex((0,), required=True),
    )
    with capture_logs() as logs:
        gpu = GpuKind().named_devices(config)
        roce = RoceKind().named_devices(config)
    warned = [e["key"] for e in logs if e["event"] == "dra_ignores_key"]
    assert warned == [
        "sharing.timeSlicing",
        "migStrategy",
        "deviceListStrategy",
        "deviceIDStrategy",
        "passDeviceSpecs",
        "imex",
        "roce.resourceName",
    ]
    assert gpu.flags.mig_strategy == "mixed" and gpu.flags.device_id_strategy == "uuid"
    # The device-plugin API's own keys are left as they are: nothing in DRA reads them.
    assert gpu.flags.pass_device_specs and gpu.flags.device_list_strategy == {"cdi-cri"}
    assert gpu.imex == Imex()  # no channel is looked for: a missing one stops nothing
    assert gpu.sharing == Sharing() and gpu.roce == config.roce and gpu.health == config.health
    assert roce.roce.resource_name == "rdma/roce" and roce.flags == config.flags
    with capture_logs() as logs:
        GpuKind().named_devices(Config.default())
        RoceKind().named_devices(Config.default())
    assert not logs
