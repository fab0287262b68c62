"""The NIC signals read from sysfs files: a tree laid out as the kernel lays it out, and
the simulator's tree, through the same reader; edits of the node file reach the files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from agents.core.nic_signals import NicReading
from agents.hw.sysfs import Sysfs
from agents.sim.node import NodeSpec, parse_node
from agents.sim.simnode import SimulatedNode
from agents.sim.sysfs_tree import SysfsTree


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def kernel_tree(root: Path) -> Sysfs:
    """An mlx5 port as the kernel shows it (class links omitted: plain directories)."""
    net = root / "class/net/ens1np0"
    write(net / "operstate", "up")
    write(net / "speed", "400000")
    write(net / "carrier_changes", "3")
    port = root / "class/infiniband/mlx5_0/ports/1"
    for name, value in (("symbol_error", 5), ("link_error_recovery", 1), ("port_rcv_errors", 0)):
        write(port / "counters" / name, str(value))
    write(port / "counters/port_xmit_data", "123456789")  # not an error counter
    for name in ("local_ack_timeout_err", "rnr_nak_retry_err", "out_of_sequence"):
        write(port / "hw_counters" / name, "7")
    return Sysfs(root)


def test_every_signal_file_is_read(tmp_path: Path) -> None:
    reading = kernel_tree(tmp_path).nic_reading("ens1np0", "mlx5_0")
    assert reading == NicReading(
        speed_mbps=400000,
        carrier_changes=3,
        up=True,
        counters=(
            ("symbol_error", 5),
            ("link_error_recovery", 1),
            ("port_rcv_errors", 0),
            ("local_ack_timeout_err", 7),
            ("rnr_nak_retry_err", 7),
            ("out_of_sequence", 7),
        ),
    )  # packet_seq_err is absent on this device: left out


def test_absent_or_odd_files_read_none(tmp_path: Path) -> None:
    sysfs = kernel_tree(tmp_path)
    net = tmp_path / "class/net/ens1np0"
    write(net / "speed", "-1")  # the kernel's answer while the link is down
    write(net / "operstate", "down")
    (net / "carrier_changes").unlink()
    write(tmp_path / "class/infiniband/mlx5_0/ports/1/counters/symbol_error", "lots")
    reading = sysfs.nic_reading("ens1np0", "mlx5_0")
    assert (reading.speed_mbps, reading.carrier_changes, reading.up) == (None, None, False)
    assert "symbol_error" not in dict(reading.counters)
    assert sysfs.nic_reading("ens9np0", None) == NicReading()  # no such interface


def node_with(nic: dict[str, object]) -> NodeSpec:
    doc = {"nics": [{"pci": "0000:1c:00.0", "netdev": "ens1np0", "rdma": "mlx5_0", **nic}]}
    return parse_node(yaml.safe_dump(doc), "node.yaml")


def test_the_simulated_tree_shows_the_node_file_and_follows_its_edits(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path / "root")
    sysfs = Sysfs(tree.sys)
    tree.apply(node_with({}))
    assert sysfs.nic_reading("ens1np0", "mlx5_0") == NicReading(None, 0, True, ())
    counters = {"symbol_error": 2, "out_of_sequence": 9, "packet_seq_err": 1}
    tree.apply(node_with({"speedMbps": 200000, "counters": counters, "carrierChanges": 5}))
    reading = sysfs.nic_reading("ens1np0", "mlx5_0")
    assert (reading.speed_mbps, reading.carrier_changes, dict(reading.counters)) == (
        200000,
        5,
        counters,
    )
    hw = tree.sys / "class/infiniband/mlx5_0/ports/1/hw_counters"
    assert sorted(p.name for p in hw.iterdir()) == ["out_of_sequence", "packet_seq_err"]
    tree.apply(node_with({"speedMbps": 200000, "counters": {"symbol_error": 3}, "link": "down"}))
    down = sysfs.nic_reading("ens1np0", "mlx5_0")
    assert down == NicReading(None, 0, False, (("symbol_error", 3),))
    tree.apply(node_with({}))
    assert sysfs.nic_reading("ens1np0", "mlx5_0") == NicReading(None, 0, True, ())


def test_a_fresh_tree_and_an_edited_one_read_the_same(tmp_path: Path) -> None:
    spec = node_with({"speedMbps": 100000, "counters": {"rnr_nak_retry_err": 4}})
    fresh = SysfsTree(tmp_path / "fresh")
    fresh.apply(spec)
    edited = SysfsTree(tmp_path / "edited")
    edited.apply(dataclasses.replace(spec, nics=()))
    edited.apply(spec)
    assert Sysfs(fresh.sys).nic_reading("ens1np0", "mlx5_0") == Sysfs(edited.sys).nic_reading(
        "ens1np0", "mlx5_0"
    )


async def test_an_edit_of_the_node_file_reaches_both_probes(tmp_path: Path) -> None:
    node_file = tmp_path / "node.yaml"
    gpu = {"uuid": "GPU-a", "pci": "0000:1b:00.0"}
    nic = {"pci": "0000:1c:00.0", "netdev": "ens1np0", "rdma": "mlx5_0", "speedMbps": 400000}
    node_file.write_text(yaml.safe_dump({"gpus": [gpu], "nics": [nic]}))
    node = SimulatedNode(node_file, tmp_path / "root")
    node.load()
    node.nvml.init()
    assert node.nvml.probe("GPU-a").pcie_width == 16
    edited = {"gpus": [{**gpu, "pcie": {"width": 8}}], "nics": [{**nic, "speedMbps": 100000}]}
    tmp = node_file.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(edited))
    tmp.replace(node_file)
    assert await node.reload()
    assert node.nvml.probe("GPU-a").pcie_width == 8
    assert node.sysfs.nic_reading("ens1np0", "mlx5_0").speed_mbps == 100000


def test_the_pci_model_of_a_nic_names_vendor_and_device(tmp_path: Path) -> None:
    tree = SysfsTree(tmp_path / "root")
    tree.apply(node_with({}))
    sysfs = Sysfs(tree.sys)
    assert sysfs.pci_model("0000:1c:00.0") == "15b3:101d"
    assert sysfs.pci_model("0000:ff:00.0") == ""
