"""RoCE discovery on a simulated sysfs tree: the configured selectors decide which RDMA
functions are the family, the link-layer selector among them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agents.config import parse_config
from agents.hw.sysfs import Sysfs
from agents.roce.discovery import discover
from agents.sim.bundled import bundled_node
from agents.sim.node import load_node
from agents.sim.specs import NodeSpec
from agents.sim.sysfs_tree import SysfsTree


def mixed_node(tmp_path: Path) -> tuple[NodeSpec, Sysfs]:
    """The bundled 8-NIC node with its first NIC's port on InfiniBand."""
    node = load_node(bundled_node("h100-8gpu-8nic"))
    infiniband = dataclasses.replace(node.nics[0], link_layer="InfiniBand")
    node = dataclasses.replace(node, nics=(infiniband, *node.nics[1:]))
    tree = SysfsTree(tmp_path / "root")
    tree.apply(node)
    return node, Sysfs(tree.sys)


@pytest.mark.parametrize(
    "config",
    ["version: v1\n", "roce: {selectors: {linkLayers: [Ethernet]}}\n"],
    ids=["default", "ethernet-named"],
)
def test_a_function_whose_port_is_infiniband_is_not_a_roce_nic(tmp_path: Path, config: str) -> None:
    node, sysfs = mixed_node(tmp_path)
    selectors = parse_config(config, "c.yaml").roce.selectors
    assert selectors.link_layers == ("Ethernet",)
    found = discover(sysfs, selectors)
    assert [n.pci for n in found] == sorted(n.pci for n in node.nics[1:])
    assert node.nics[0].rdma in {d.name for d in sysfs.rdma_devices()}  # present, not chosen


def test_the_link_layer_selector_is_what_leaves_the_infiniband_function_out(
    tmp_path: Path,
) -> None:
    node, sysfs = mixed_node(tmp_path)
    selectors = parse_config("version: v1\n", "c.yaml").roce.selectors
    any_layer = dataclasses.replace(selectors, link_layers=("Ethernet", "InfiniBand"))
    assert [n.pci for n in discover(sysfs, any_layer)] == sorted(n.pci for n in node.nics)
