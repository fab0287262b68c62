"""The node file's GFD facts: a GPU's fabric and compute capability, the node's DMI
product name; parsed strictly and shown by the simulated sysfs tree as a kernel shows them."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.core.fabric_health import HEALTHY_MASK
from agents.core.gfd_facts import Fabric
from agents.errors import ConfigError
from agents.hw.sysfs import Sysfs
from agents.sim.node import parse_node
from agents.sim.sysfs_tree import SysfsTree

GPU = 'uuid: GPU-1, pci: "0000:1b:00.0"'
CLUSTER = "5a1e2b3c-4d5e-4f60-8172-839405a6b7c8"


def node(gpu_extra: str = "", top: str = "") -> str:
    return f"{top}\ngpus:\n  - {{{GPU}{', ' + gpu_extra if gpu_extra else ''}}}\n"


@pytest.mark.parametrize(
    ("extra", "fabric"),
    [
        ("", None),
        (f"fabric: {{clusterUuid: {CLUSTER}}}", Fabric(CLUSTER, 0, 3, 0, HEALTHY_MASK)),
        (
            f"fabric: {{clusterUuid: {CLUSTER.upper()}, cliqueId: 7, state: inProgress, "
            "status: Timeout}",
            Fabric(CLUSTER, 7, 2, 10, HEALTHY_MASK),
        ),
        (
            f"fabric: {{clusterUuid: {CLUSTER}, "
            "health: [routeUnhealthy, degradedBandwidth, insufficientNvlinks]}",
            # bandwidth TRUE (1), route recovery FALSE (2 << 2), route unhealthy TRUE
            # (1 << 4), access timeout FALSE (2 << 6), insufficient NVLinks (5 << 8)
            Fabric(CLUSTER, 0, 3, 0, 0x1 | 0x8 | 0x10 | 0x80 | 0x500),
        ),
    ],
    ids=["none", "defaults-completed-success", "all-given", "health-at-fault"],
)
def test_a_gpus_fabric_is_read_with_nvmls_values(extra: str, fabric: Fabric | None) -> None:
    assert parse_node(node(extra), "n.yaml").gpus[0].fabric == fabric


@pytest.mark.parametrize(
    ("extra", "where"),
    [
        ("fabric: {cliqueId: 1}", "gpus[0].fabric.clusterUuid"),
        ("fabric: {clusterUuid: not-a-uuid}", "gpus[0].fabric.clusterUuid"),
        (f"fabric: {{clusterUuid: {CLUSTER}, state: done}}", "gpus[0].fabric.state"),
        (f"fabric: {{clusterUuid: {CLUSTER}, cliqueId: -1}}", "gpus[0].fabric.cliqueId"),
        (f"fabric: {{clusterUuid: {CLUSTER}, summary: ok}}", "gpus[0].fabric"),
        (f"fabric: {{clusterUuid: {CLUSTER}, health: ok}}", "gpus[0].fabric.health"),
        (f"fabric: {{clusterUuid: {CLUSTER}, health: [slow]}}", "gpus[0].fabric.health[0]"),
        (
            f"fabric: {{clusterUuid: {CLUSTER}, health: [noPartition, invalidLocation]}}",
            "gpus[0].fabric.health",
        ),
        ("computeCapability: 9", "gpus[0].computeCapability"),
    ],
    ids=[
        *("no-cluster", "bad-uuid", "bad-state", "negative-clique", "unknown-key"),
        *("health-not-a-list", "health-unknown-name", "two-incorrect-configurations"),
        "unquoted-cc",
    ],
)
def test_a_bad_fabric_or_capability_names_its_key(extra: str, where: str) -> None:
    with pytest.raises(ConfigError, match=where.replace("[", r"\[").replace("]", r"\]")):
        parse_node(node(extra), "n.yaml")


def test_the_tree_shows_the_dmi_name_a_gpus_class_and_config_space(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path)
    tree.apply(parse_node(node(top='machine: "PowerEdge XE9680"'), "n.yaml"))
    sysfs = Sysfs(tmp_path / "sys")
    assert sysfs.machine_type() == "PowerEdge XE9680"
    assert sysfs.pci_class("0000:1b:00.0") == 0x030200
    configs = sysfs.nvidia_configs()
    assert configs is not None and len(configs) == 1 and len(configs[0]) == 256
    tree.apply(parse_node(node(), "n.yaml"))
    assert sysfs.machine_type() is None
