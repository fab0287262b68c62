"""Whole-node checks of a parsed node file: unique names, one PCI tree, NVLink peers."""

from __future__ import annotations

from collections.abc import Iterable

from agents.sim.fields import Fields
from agents.sim.specs import GpuSpec, NicSpec, NodeSpec


def check_node(f: Fields, node: NodeSpec) -> None:
    """Raise ConfigError for the first thing that makes the node impossible."""
    devices: list[tuple[str, GpuSpec | NicSpec]] = [
        *((f"gpus[{i}]", g) for i, g in enumerate(node.gpus)),
        *((f"nics[{i}]", n) for i, n in enumerate(node.nics)),
    ]
    _unique(f, ((f"gpus[{i}].uuid", g.uuid) for i, g in enumerate(node.gpus)), "UUID")
    _unique(f, _mig_uuids(node), "UUID")
    _unique(f, ((f"{p}.pci", d.pci) for p, d in devices), "PCI address")
    _unique(f, ((f"gpus[{i}].minor", g.minor) for i, g in enumerate(node.gpus)), "minor")
    _unique(f, ((f"nics[{i}].netdev", n.netdev) for i, n in enumerate(node.nics)), "netdev")
    _unique(f, ((f"nics[{i}].rdma", n.rdma) for i, n in enumerate(node.nics) if n.rdma), "rdma")
    uverbs = ((f"nics[{i}].uverbs", n.uverbs) for i, n in enumerate(node.nics) if n.rdma)
    _unique(f, uverbs, "uverbs index")
    for path, device in devices:
        if device.numa is not None and device.numa >= node.numa_nodes:
            f.fail(f"{path}.numa", f"a NUMA node < numaNodes ({node.numa_nodes})")
    _check_tree(f, devices)
    _check_nvlinks(f, node)


def _mig_uuids(node: NodeSpec) -> Iterable[tuple[str, str]]:
    for i, g in enumerate(node.gpus):
        yield f"gpus[{i}].uuid", g.uuid
        for j, inst in enumerate(g.mig_instances):
            yield f"gpus[{i}].mig.instances[{j}].uuid", inst.uuid


def _unique(f: Fields, pairs: Iterable[tuple[str, object]], what: str) -> None:
    seen: dict[object, str] = {}
    for path, value in pairs:
        if value in seen:
            f.fail(path, f"a unique {what} ({value} is also {seen[value]})")
        seen[value] = path


def _check_tree(f: Fields, devices: list[tuple[str, GpuSpec | NicSpec]]) -> None:
    """Bridges must form one tree: each bridge has one parent, devices are leaves."""
    leaves = {d.pci: path for path, d in devices}
    parents: dict[str, tuple[str | None, str]] = {}
    for path, device in devices:
        chain = (*device.upstream, device.pci)
        if len(set(chain)) != len(chain):
            f.fail(f"{path}.upstream", "bridges that appear once, none of them the device")
        for k, bridge in enumerate(device.upstream):
            where = f"{path}.upstream[{k}]"
            if bridge in leaves:
                f.fail(where, f"a bridge, not a device ({bridge} is {leaves[bridge]}.pci)")
            parent = device.upstream[k - 1] if k else None
            known = parents.setdefault(bridge, (parent, where))
            if known[0] != parent:
                above = known[0] or "the host bridge"
                f.fail(where, f"the same place in the tree as in {known[1]} (below {above})")


def _check_nvlinks(f: Fields, node: NodeSpec) -> None:
    uuids = {g.uuid for g in node.gpus}
    for i, gpu in enumerate(node.gpus):
        if node.nvswitch and gpu.nvlinks:
            f.fail(
                f"gpus[{i}].nvlinks", "no direct NVLinks with nvswitch: true (they end at switches)"
            )
        for k, peer in enumerate(gpu.nvlinks):
            if peer not in uuids or peer == gpu.uuid:
                f.fail(f"gpus[{i}].nvlinks[{k}]", "the UUID of another GPU of this node")
