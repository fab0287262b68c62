"""The NIC signals read from sysfs files: a tree laid out as the kernel lays it out, the
simulator's tree and a real veth's files, through the same reader and the RoCE family's
watch; edits of the node file reach the files."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from structlog.testing import capture_logs

from agents.core.degraded import BACKWARDS, NOT_OFFERED, Limits
from agents.core.health import signals_of
from agents.core.nic_signals import NicReading
from agents.hw.netlink import LinkState, NetlinkMonitor
from agents.hw.sysfs import Sysfs
from agents.roce.discovery import Nic
from agents.roce.signals import NicSignalWatch
from agents.sim.node import parse_node
from agents.sim.simnode import SimulatedNode
from agents.sim.specs import NodeSpec
from agents.sim.sysfs_tree import SysfsTree
from tests.conditions import WAIT, async_wait_until
from tests.veth import ip, veth_pair


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


# The RoCE family's watch over these files (agents.roce.signals): one round per probe(),
# on an injected clock, so that windows and holds of minutes pass at once.

HOLD_S = 60.0
PROBE_WAIT_S = 5.0  # a round of file reads ends well within this on a loaded machine


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


SIM_NIC = Nic("0000:1c:00.0", "mlx5_0", 1, "ens1np0", "uverbs0", 0, None)


def always_up(_: Nic) -> bool:
    return True


@pytest.fixture
def sim_watch(tmp_path: Path) -> Iterator[tuple[SysfsTree, NicSignalWatch, Clock]]:
    tree = SysfsTree(tmp_path / "root")
    clock = Clock()
    watch = NicSignalWatch(Sysfs(tree.sys), Limits(HOLD_S, 0, 10), clock=clock)
    watch.watch([SIM_NIC])
    yield tree, watch, clock
    watch.close()


async def test_rdma_errors_on_the_simulated_node_both_ways(
    sim_watch: tuple[SysfsTree, NicSignalWatch, Clock],
) -> None:
    tree, watch, clock = sim_watch
    counters = {"symbol_error": 0, "out_of_sequence": 0}
    tree.apply(node_with({"counters": counters}))
    assert not (await watch.probe(PROBE_WAIT_S, always_up)).causes
    clock.now += 5
    tree.apply(node_with({"counters": {**counters, "symbol_error": 10}}))  # at the limit
    assert not (await watch.probe(PROBE_WAIT_S, always_up)).causes
    clock.now += 5
    tree.apply(node_with({"counters": {"symbol_error": 10, "out_of_sequence": 11}}))
    assert (await watch.probe(PROBE_WAIT_S, always_up)).causes
    cause = watch.cause(SIM_NIC.pci)
    assert cause is not None and cause.label == "rdma-errors"
    # Only the counter over the limit is named.
    assert cause.text() == "ens1np0 RDMA errors in the last minute: out_of_sequence +11 (limit 10)"
    clock.now += 30  # no growth since, but still within the minute
    assert not (await watch.probe(PROBE_WAIT_S, always_up)).causes
    assert watch.cause(SIM_NIC.pci) == cause
    clock.now += 31  # out of the minute; held since the last probe out of limits
    assert not (await watch.probe(PROBE_WAIT_S, always_up)).causes
    clock.now += HOLD_S
    assert (await watch.probe(PROBE_WAIT_S, always_up)).causes
    assert watch.cause(SIM_NIC.pci) is None


async def test_link_flaps_on_the_simulated_node_both_ways(
    sim_watch: tuple[SysfsTree, NicSignalWatch, Clock],
) -> None:
    tree, watch, clock = sim_watch
    tree.apply(node_with({"carrierChanges": 4}))
    assert not (await watch.probe(PROBE_WAIT_S, always_up)).causes
    tree.apply(node_with({"carrierChanges": 6}))  # one down and up: allowed
    clock.now += 5
    assert not (await watch.probe(PROBE_WAIT_S, always_up)).causes
    tree.apply(node_with({"carrierChanges": 7}))
    clock.now += 5
    assert not (await watch.probe(PROBE_WAIT_S, lambda _: False)).causes  # down now: Unhealthy's
    assert (await watch.probe(PROBE_WAIT_S, always_up)).causes
    cause = watch.cause(SIM_NIC.pci)
    assert cause is not None and cause.label == "link-flaps"
    assert cause.text() == "ens1np0 link changed 3 times in the last 10 minutes"
    clock.now += 590  # all three changes still within the ten minutes
    assert not (await watch.probe(PROBE_WAIT_S, always_up)).causes
    assert watch.cause(SIM_NIC.pci) == cause
    clock.now += 15  # the first change is out of the window: within limits, held
    assert not (await watch.probe(PROBE_WAIT_S, always_up)).causes
    clock.now += HOLD_S
    assert (await watch.probe(PROBE_WAIT_S, always_up)).causes
    assert watch.cause(SIM_NIC.pci) is None


async def test_counters_going_backwards_or_absent_are_unknown_once_never_degraded(
    sim_watch: tuple[SysfsTree, NicSignalWatch, Clock],
) -> None:
    tree, watch, clock = sim_watch
    with capture_logs() as logs:
        tree.apply(node_with({"carrierChanges": 50}))  # no speed file, no RDMA counters
        for _ in range(3):
            assert not (await watch.probe(PROBE_WAIT_S, always_up)).causes
            watch.tell()
            clock.now += 5
        tree.apply(node_with({"counters": {"symbol_error": 500}, "carrierChanges": 50}))
        assert not (await watch.probe(PROBE_WAIT_S, always_up)).causes
        for _ in range(3):  # reset to 0 (a driver reload): backwards, then steady
            clock.now += 5
            tree.apply(node_with({"counters": {"symbol_error": 0}, "carrierChanges": 0}))
            assert not (await watch.probe(PROBE_WAIT_S, always_up)).causes
            watch.tell()
            assert watch.cause(SIM_NIC.pci) is None
    unknown = [(e["signal"], e["reason"]) for e in logs if e["event"] == "device_signal_unknown"]
    assert sorted(unknown) == sorted(
        [
            ("link-speed", NOT_OFFERED),
            ("rdma-errors", NOT_OFFERED),
            ("rdma-errors/symbol_error", BACKWARDS),
            ("link-flaps", BACKWARDS),
        ]
    )
    assert all(e["device"] == SIM_NIC.pci for e in logs if e["event"] == "device_signal_unknown")


@pytest.mark.netns
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"
)
async def test_a_real_veth_speed_and_carrier_changes_through_the_kernel_sysfs() -> None:
    """A veth in this namespace, its peer in another: the kernel's own speed (10000 Mb/s)
    and carrier_changes files, and its link state from netlink."""
    with veth_pair("nas", "na-sig", "nassigpeer") as (host, netns):
        monitor = NetlinkMonitor()
        clock = Clock()
        nic = Nic("0000:00:00.0", "nonexistent_0", 1, host, "uverbs99", None, None)
        watch = NicSignalWatch(Sysfs(), Limits(HOLD_S, 25000, 10), clock=clock)
        watch.watch([nic])

        def up(n: Nic) -> bool:
            return monitor.state(n.netdev) is LinkState.UP

        try:
            await async_wait_until(lambda: up(nic), WAIT, "the veth up")
            assert (await watch.probe(PROBE_WAIT_S, up)).causes
            slow = watch.cause(nic.pci)
            assert slow is not None and slow.text() == f"{host} at 10000 Mb/s, expected 25000"
            watch.apply(Limits(HOLD_S, 10000, 10))
            for _ in range(2):  # two flaps: four carrier changes
                ip("-n", netns, "link", "set", "nassigpeer", "down")
                await async_wait_until(lambda: not up(nic), WAIT, "the veth down")
                ip("-n", netns, "link", "set", "nassigpeer", "up")
                await async_wait_until(lambda: up(nic), WAIT, "the veth up")
            clock.now += 5
            assert (await watch.probe(PROBE_WAIT_S, up)).causes
            # The slow link is held still (the hold outlasts the limit's change).
            flaps = {x.name: x for x in signals_of(watch.cause(nic.pci))}["link-flaps"]
            changes = flaps.figures()["changes"]
            assert isinstance(changes, int) and changes >= 4
            clock.now += 601 + HOLD_S
            assert (await watch.probe(PROBE_WAIT_S, up)).causes  # in limits for the hold since
            assert watch.cause(nic.pci) is None
        finally:
            watch.close()
            monitor.close()
