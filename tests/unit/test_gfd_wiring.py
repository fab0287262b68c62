"""Where GFD's facts leave the GPU family: the DRA attributes of a GPU's NVLink domain, on
attached GPUs only, and --label-node's patch of the `nvidia.com/` labels it owns."""

from __future__ import annotations

from pathlib import Path

from agents.cluster.node_labeller import label_patch, owned
from agents.config import Config
from agents.core.fabric_place import ALL_KEYS, LEAF_GROUP
from agents.gpu.dra import CLIQUE_ID, CLUSTER_UUID
from agents.gpu.kind import GpuKind
from agents.sim.bundled import bundled_node
from agents.sim.simnode import SimulatedNode
from tests.families import gpu_family

CLUSTER = "5a1e2b3c-4d5e-4f60-8172-839405a6b7c8"


def _attributes(tmp_path: Path, second_state: str = "completed") -> list[dict[str, object]]:
    source = bundled_node("gb200-4gpu-4nic").read_text()
    node_file = tmp_path / "node.yaml"
    marker = 'minor: 1,\n     model: NVIDIA GB200, memoryMiB: 189471, computeCapability: "10.0",\n'
    lines = source.replace(
        marker + f"     fabric: {{clusterUuid: {CLUSTER}, cliqueId: 1}}",
        marker + f"     fabric: {{clusterUuid: {CLUSTER}, cliqueId: 1, state: {second_state}}}",
    )
    node_file.write_text(lines)
    node = SimulatedNode(node_file, tmp_path / "root")
    node.load()
    family = gpu_family(
        node.nvml, node.sysfs, GpuKind().named_devices(Config.default()), dev_root=node.dev_root
    )
    return [dict(d.attributes) for d in sorted(family.facts().devices, key=lambda d: d.name)]


def test_attached_gpus_carry_their_cluster_and_clique(tmp_path: Path) -> None:
    attributes = _attributes(tmp_path)
    assert [(a[CLUSTER_UUID], a[CLIQUE_ID]) for a in attributes] == [(CLUSTER, "1")] * 4


def test_a_gpu_not_yet_registered_carries_neither(tmp_path: Path) -> None:
    attributes = _attributes(tmp_path, second_state="inProgress")
    assert [CLUSTER_UUID in a for a in attributes] == [True, False, True, True]
    assert [CLIQUE_ID in a for a in attributes] == [True, False, True, True]


def test_gpus_without_a_fabric_carry_neither(tmp_path: Path) -> None:
    node = SimulatedNode(bundled_node("h100-8gpu-8nic"), tmp_path)
    node.load()
    family = gpu_family(
        node.nvml, node.sysfs, GpuKind().named_devices(Config.default()), dev_root=node.dev_root
    )
    for device in family.facts().devices:
        assert CLUSTER_UUID not in device.attributes and CLIQUE_ID not in device.attributes


def test_the_node_labeller_owns_gfds_keys_and_the_fabrics_not_others() -> None:
    assert owned("nvidia.com/gpu.count") and owned(LEAF_GROUP)
    assert not owned("node-agents.io/gpu.count") and not owned("kubernetes.io/hostname")


def test_a_label_patched_before_and_no_longer_wanted_is_removed() -> None:
    before = {"nvidia.com/gpu.clique": "x.1", "nvidia.com/gpu.count": "4"}
    patch = label_patch({"nvidia.com/gpu.count": "3"}, before)
    assert patch == {
        "metadata": {
            "labels": {
                **dict.fromkeys(ALL_KEYS),  # the fabric's, as before
                "nvidia.com/gpu.clique": None,
                "nvidia.com/gpu.count": "3",
            }
        }
    }
