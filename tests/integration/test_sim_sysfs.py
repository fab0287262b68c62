"""The simulator's sysfs tree, read back through the same Sysfs that reads a real node."""

from __future__ import annotations

import dataclasses
import os
import stat
from pathlib import Path

import pytest

from agents.errors import BackendError
from agents.hw.nvidia_caps import access_files, mig_cap_devices
from agents.hw.sysfs import RdmaPort, Sysfs
from agents.sim.bundled import bundled_node
from agents.sim.node import load_node
from agents.sim.specs import NodeSpec
from agents.sim.sysfs_tree import SysfsTree

NODES = ["h100-8gpu-8nic", "h100-8gpu-4nic"]


def build(tmp_path: Path, name: str) -> tuple[NodeSpec, SysfsTree, Sysfs]:
    node = load_node(bundled_node(name))
    tree = SysfsTree(tmp_path / "root")
    tree.apply(node)
    return node, tree, Sysfs(tree.sys)


def pci_functions(tree: SysfsTree) -> set[str]:
    """The addresses the tree lists under bus/pci/devices (bridges included)."""
    return set(os.listdir(tree.sys / "bus/pci/devices"))


def operstate(tree: SysfsTree, netdev: str) -> str:
    return (tree.sys / "class/net" / netdev / "operstate").read_text().strip()


@pytest.mark.parametrize("name", NODES, ids=str)
def test_every_nic_is_found_with_its_pci_netdev_uverbs_numa_and_port(
    tmp_path: Path, name: str
) -> None:
    node, tree, sysfs = build(tmp_path, name)
    found = {d.name: d for d in sysfs.rdma_devices()}
    assert set(found) == {n.rdma for n in node.nics}
    for nic in node.nics:
        dev = found[str(nic.rdma)]
        assert (dev.pci, dev.netdevs, dev.numa, dev.vendor) == (
            nic.pci,
            (nic.netdev,),
            nic.numa,
            "15b3",
        )
        assert dev.uverbs == f"uverbs{nic.uverbs}"
        assert dev.ports == (RdmaPort(1, "ACTIVE", "Ethernet"),)
        assert sysfs.port_state(str(nic.rdma), 1) == "ACTIVE"
        assert operstate(tree, nic.netdev) == "up"


@pytest.mark.parametrize("name", NODES, ids=str)
def test_real_path_gives_the_bridge_chain_of_the_file(tmp_path: Path, name: str) -> None:
    node, tree, sysfs = build(tmp_path, name)
    for dev in node.devices:
        assert sysfs.pci_real_path(dev.pci).startswith("devices/pci")
        location = sysfs.pci_location(dev.pci)
        assert location is not None
        assert (*location.bridges, location.address) == (*dev.upstream, dev.pci)
        assert location.host_bridge == "pci" + dev.upstream[0].rsplit(":", 1)[0]
        assert location.numa == sysfs.numa_node(dev.pci) == dev.numa
    gpu = tree.sys / "bus/pci/devices" / node.gpus[0].pci
    assert (gpu / "vendor").read_text() == "0x10de\n"
    assert (gpu / "class").read_text() == "0x030200\n"
    bridges = {b for d in node.devices for b in d.upstream}
    assert pci_functions(tree) == bridges | {d.pci for d in node.devices}


def test_class_net_links_to_the_nic_function(tmp_path: Path) -> None:
    node, tree, _ = build(tmp_path, "h100-8gpu-8nic")
    nic = node.nics[0]
    device = tree.sys / "class/net" / nic.netdev / "device"
    assert Path(os.path.realpath(device)).name == nic.pci
    ib_device = tree.sys / "class/infiniband" / str(nic.rdma) / "device"
    assert Path(os.path.realpath(ib_device)).name == nic.pci


def test_device_nodes_are_character_devices_under_the_root(tmp_path: Path) -> None:
    node, tree, _ = build(tmp_path, "h100-8gpu-8nic")
    paths = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    paths += [f"/dev/nvidia{g.minor}" for g in node.gpus]
    paths += ["/dev/infiniband/rdma_cm"] + [f"/dev/infiniband/uverbs{n.uverbs}" for n in node.nics]
    for container_path in paths:
        st = os.stat(str(tree.dev_root) + container_path)
        assert stat.S_ISCHR(st.st_mode), container_path
        assert st.st_rdev == os.makedev(1, 3)
        assert stat.S_IMODE(st.st_mode) == 0o666


def test_link_down_changes_port_state_and_operstate(tmp_path: Path) -> None:
    node, tree, sysfs = build(tmp_path, "h100-8gpu-8nic")
    nic = node.nics[2]
    down = dataclasses.replace(nic, link="down")
    tree.apply(dataclasses.replace(node, nics=(*node.nics[:2], down, *node.nics[3:])))
    assert sysfs.port_state(str(nic.rdma), 1) == "DOWN"
    assert operstate(tree, nic.netdev) == "down"
    assert sysfs.port_state(str(node.nics[0].rdma), 1) == "ACTIVE"


def test_removed_nic_disappears_and_comes_back(tmp_path: Path) -> None:
    node, tree, sysfs = build(tmp_path, "h100-8gpu-8nic")
    gone = node.nics[0]
    tree.apply(dataclasses.replace(node, nics=node.nics[1:]))
    assert str(gone.rdma) not in {d.name for d in sysfs.rdma_devices()}
    assert sysfs.pci_real_path(gone.pci) == ""
    assert sysfs.port_state(str(gone.rdma), 1) == ""
    assert not (tree.sys / "class/net" / gone.netdev).exists()
    assert not os.path.lexists(str(tree.dev_root) + f"/dev/infiniband/uverbs{gone.uverbs}")
    tree.apply(node)
    assert len(sysfs.rdma_devices()) == len(node.nics)


def test_removed_gpu_takes_its_device_node_and_unshared_bridges(tmp_path: Path) -> None:
    node, tree, sysfs = build(tmp_path, "h100-8gpu-8nic")
    gpu = node.gpus[0]
    tree.apply(dataclasses.replace(node, gpus=node.gpus[1:]))
    assert sysfs.pci_real_path(gpu.pci) == ""
    assert gpu.upstream[-1] not in pci_functions(tree)  # its own downstream port
    assert gpu.upstream[0] in pci_functions(tree)  # the root port still has the NIC
    assert not os.path.lexists(str(tree.dev_root) + f"/dev/nvidia{gpu.minor}")


def test_moved_device_is_found_at_its_new_place(tmp_path: Path) -> None:
    node, tree, sysfs = build(tmp_path, "h100-8gpu-8nic")
    moved = dataclasses.replace(node.nics[0], upstream=(*node.gpus[7].upstream[:2], "0000:c7:05.0"))
    tree.apply(dataclasses.replace(node, nics=(moved, *node.nics[1:])))
    location = sysfs.pci_location(moved.pci)
    assert location is not None
    assert (*location.bridges, location.address) == (*moved.upstream, moved.pci)
    assert str(moved.rdma) in {d.name for d in sysfs.rdma_devices()}


def test_reapplying_the_same_node_changes_nothing(tmp_path: Path) -> None:
    node, tree, sysfs = build(tmp_path, "h100-8gpu-4nic")
    before = sysfs.rdma_devices()
    tree.apply(node)
    assert sysfs.rdma_devices() == before


def test_missing_root_is_a_backend_error_and_missing_files_are_absent(tmp_path: Path) -> None:
    _, _, sysfs = build(tmp_path, "h100-8gpu-4nic")
    assert sysfs.numa_node("0000:00:00.0") is None
    assert sysfs.pci_location("0000:00:00.0") is None
    assert sysfs.port_state("mlx5_99", 1) == ""
    with pytest.raises(BackendError, match="no sysfs"):
        Sysfs(tmp_path / "nowhere").rdma_devices()


def _snapshot(root: Path) -> dict[str, tuple[str, str]]:
    """Every entry under root: ("dir", ""), ("link", target), ("file", text), ("dev", "")."""
    out: dict[str, tuple[str, str]] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(".staging"):
            continue
        mode = path.lstat().st_mode
        if stat.S_ISLNK(mode):
            out[rel] = ("link", os.readlink(path))
        elif stat.S_ISDIR(mode):
            out[rel] = ("dir", "")
        elif stat.S_ISCHR(mode):
            out[rel] = ("dev", "")
        else:
            out[rel] = ("file", path.read_bytes().decode("latin-1"))  # config spaces are binary
    return out


def test_a_tree_built_afresh_equals_one_brought_there_by_edits(tmp_path: Path) -> None:
    node = load_node(bundled_node("h100-8gpu-8nic"))
    edited = SysfsTree(tmp_path / "edited")
    other = dataclasses.replace(
        node,
        gpus=node.gpus[2:],
        nics=(dataclasses.replace(node.nics[0], link="down"), *node.nics[3:]),
    )
    edited.apply(other)
    edited.apply(node)
    fresh = SysfsTree(tmp_path / "fresh")
    fresh.apply(node)
    assert _snapshot(edited.root) == _snapshot(fresh.root)


def test_edits_sysfs_does_not_show_leave_the_tree_and_later_edits_still_apply(
    tmp_path: Path,
) -> None:
    node, tree, sysfs = build(tmp_path, "h100-8gpu-8nic")
    before = _snapshot(tree.root)
    lost = dataclasses.replace(node.gpus[0], xids=(79,), lost=True, model="other")
    faulty = dataclasses.replace(node, gpus=(lost, *node.gpus[1:]))
    tree.apply(faulty)
    assert _snapshot(tree.root) == before
    nic = node.nics[2]
    down = dataclasses.replace(nic, link="down")
    tree.apply(dataclasses.replace(faulty, nics=(*node.nics[:2], down, *node.nics[3:])))
    assert sysfs.port_state(str(nic.rdma), 1) == "DOWN"
    tree.apply(node)
    assert _snapshot(tree.root) == before


def test_mig_access_files_name_capability_devices_that_exist_and_go_with_mig(
    tmp_path: Path,
) -> None:
    node, tree, _ = build(tmp_path, "mig-mixed")
    gpu = node.gpus[0]
    root = str(tree.dev_root)
    caps = [mig_cap_devices(root, gpu.minor, mig) for mig in gpu.mig_instances]
    assert len({cap for pair in caps for cap in pair}) == 2 * len(gpu.mig_instances)
    for pair in caps:
        for cap in pair:
            assert stat.S_ISCHR(os.stat(root + cap).st_mode), cap
    whole = dataclasses.replace(gpu, mig_enabled=False)
    tree.apply(dataclasses.replace(node, gpus=(whole, *node.gpus[1:])))
    for mig, pair in zip(gpu.mig_instances, caps, strict=True):
        with pytest.raises(BackendError, match="/access: No such file"):
            mig_cap_devices(root, gpu.minor, mig)
        assert not any(os.path.lexists(root + cap) for cap in pair)
    tree.apply(node)
    fresh = SysfsTree(tmp_path / "fresh")
    fresh.apply(node)
    assert _snapshot(tree.root) == _snapshot(fresh.root)


def test_an_access_file_without_a_minor_is_a_backend_error_naming_it(tmp_path: Path) -> None:
    node, tree, _ = build(tmp_path, "mig-mixed")
    gpu = node.gpus[0]
    gi_file, _ = access_files(gpu.minor, gpu.mig_instances[1])
    Path(str(tree.dev_root) + gi_file).write_text("DeviceFileMode: 292\n")
    with pytest.raises(BackendError, match=f"^{gi_file}: no DeviceFileMinor line$"):
        mig_cap_devices(str(tree.dev_root), gpu.minor, gpu.mig_instances[1])
