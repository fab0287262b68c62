"""Fault injection: edits of the node file, seen through real inotify, reach the fake NVML,
the link monitor and the sysfs tree within one second; malformed edits change nothing."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import structlog
import yaml

from agents.errors import BackendError
from agents.hw.netlink import LinkState
from agents.hw.nvml import XidEvent
from agents.sim.bundled import bundled_node
from agents.sim.links import SimLinkMonitor
from agents.sim.simnode import SimulatedNode
from agents.sim.specs import NodeSpec
from agents.tasks import until
from tests.conditions import async_wait_until
from tests.writers import write_atomic, write_in_place

WITHIN = 1.0  # a node-file edit takes effect within one second


WRITERS = [write_in_place, write_atomic]
Writer = Callable[[Path, str], None]


def edit(path: Path, change: Callable[[dict[str, Any]], None], writer: Writer) -> None:
    doc = yaml.safe_load(path.read_text())
    change(doc)
    writer(path, yaml.safe_dump(doc))


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[SimulatedNode]:
    node_file = tmp_path / "etc/node.yaml"
    node_file.parent.mkdir()
    shutil.copy(bundled_node("h100-8gpu-8nic"), node_file)
    sim = SimulatedNode(node_file, tmp_path / "root")
    sim.load()
    sim.nvml.init()
    stop = asyncio.Event()
    task = asyncio.create_task(until(stop, sim.run))
    await asyncio.wait_for(sim.watching.wait(), 5)
    yield sim
    stop.set()
    await asyncio.wait_for(task, 5)


async def events_until(sim: SimulatedNode, wanted: XidEvent) -> list[XidEvent]:
    seen: list[XidEvent] = []
    while wanted not in seen:
        seen += await sim.nvml.next_events(timeout_s=5)
    return seen


@pytest.mark.parametrize("writer", WRITERS, ids=["in-place", "atomic-rename"])
async def test_appended_xid_is_delivered_within_a_second(
    node: SimulatedNode, writer: Writer
) -> None:
    gpu = node.spec.gpus[3]
    edit(node.node_file, lambda d: d["gpus"][3]["xids"].append(48), writer)
    events = await asyncio.wait_for(events_until(node, XidEvent(gpu.uuid, 48)), WITHIN)
    assert events == [XidEvent(gpu.uuid, 48)]
    # An XID is an event only: NVML itself still answers for the GPU, as real NVML does.
    assert node.nvml.status(gpu.uuid).answering


async def test_second_appended_xid_delivers_only_the_new_one(node: SimulatedNode) -> None:
    gpu = node.spec.gpus[0]
    edit(node.node_file, lambda d: d["gpus"][0]["xids"].append(31), write_atomic)
    await asyncio.wait_for(events_until(node, XidEvent(gpu.uuid, 31)), WITHIN)
    edit(node.node_file, lambda d: d["gpus"][0]["xids"].append(31), write_atomic)
    events = await asyncio.wait_for(events_until(node, XidEvent(gpu.uuid, 31)), WITHIN)
    assert events == [XidEvent(gpu.uuid, 31)]


async def test_lost_gpu_delivers_xid_79_and_reports_lost(node: SimulatedNode) -> None:
    gpu = node.spec.gpus[5]
    edit(node.node_file, lambda d: d["gpus"][5].update(lost=True), write_in_place)
    await asyncio.wait_for(events_until(node, XidEvent(gpu.uuid, 79)), WITHIN)
    assert node.nvml.status(gpu.uuid).lost


async def test_link_down_is_reported_down(node: SimulatedNode) -> None:
    nic = node.spec.nics[1]
    assert node.links.state(nic.netdev) is LinkState.UP
    edit(node.node_file, lambda d: d["nics"][1].update(link="down"), write_atomic)
    assert await asyncio.wait_for(node.links.next_change(timeout_s=5), WITHIN)
    assert node.links.state(nic.netdev) is LinkState.DOWN
    assert node.sysfs.port_state(str(nic.rdma), 1) == "DOWN"


async def test_removed_gpu_leaves_gpus_and_wakes_next_events(node: SimulatedNode) -> None:
    gone = node.spec.gpus[2]
    version = node.version

    def remove(d: dict[str, Any]) -> None:
        del d["gpus"][2]
        for g in d["gpus"]:
            g["nvlinks"].remove(gone.uuid)

    edit(node.node_file, remove, write_in_place)
    assert await asyncio.wait_for(node.nvml.next_events(timeout_s=5), WITHIN) == []
    await asyncio.wait_for(node.wait_version(version + 1), WITHIN)
    assert gone.uuid not in {g.uuid for g in node.nvml.gpus()}
    assert len(node.nvml.gpus()) == 7
    assert node.nvml.status(gone.uuid).gone
    with pytest.raises(BackendError, match="GPU-never-there"):
        node.nvml.status("GPU-never-there")
    assert node.sysfs.pci_real_path(gone.pci) == ""


@pytest.mark.parametrize("writer", WRITERS, ids=["in-place", "atomic-rename"])
async def test_malformed_edit_is_logged_and_changes_nothing(
    node: SimulatedNode, writer: Writer
) -> None:
    before, version, rejected = node.nvml.gpus(), node.version, node.rejected
    broken = node.node_file.read_text().replace("link: up", "link: sideways", 1)
    with structlog.testing.capture_logs() as logs:
        writer(node.node_file, broken)
        await async_wait_until(lambda: node.rejected > rejected, WITHIN, "edit refused")
    invalid = [e for e in logs if e["event"] == "node_file_invalid"]
    assert invalid and "link: up or down" in invalid[0]["error"]
    assert (node.version, node.nvml.gpus()) == (version, before)
    assert all(node.links.state(n.netdev) is LinkState.UP for n in node.spec.nics)
    fixed = yaml.safe_load(broken.replace("link: sideways", "link: up"))
    fixed["gpus"][0]["xids"].append(48)
    writer(node.node_file, yaml.safe_dump(fixed))  # the next valid edit applies again
    await asyncio.wait_for(node.wait_version(version + 1), WITHIN)
    xid = XidEvent(node.spec.gpus[0].uuid, 48)
    assert xid in await asyncio.wait_for(events_until(node, xid), WITHIN)


class FakeHostLinks:
    """A host link monitor that knows only `lo`, reported DOWN, and one pending change."""

    def __init__(self) -> None:
        self.closed = False
        self.change = asyncio.Event()

    def state(self, ifname: str) -> LinkState:
        return LinkState.DOWN if ifname == "lo" else LinkState.ABSENT

    async def next_change(self, timeout_s: float) -> bool:
        await asyncio.wait_for(self.change.wait(), timeout_s)
        return True

    def close(self) -> None:
        self.closed = True


def _node_with_lo() -> NodeSpec:
    from agents.sim.specs import NicSpec

    return NodeSpec(nics=(NicSpec("0000:1c:00.0", "lo"), NicSpec("0000:1d:00.0", "ens9")))


async def test_interface_on_the_host_takes_its_state_from_the_host_monitor() -> None:
    host = FakeHostLinks()
    links = SimLinkMonitor(_node_with_lo(), host)
    assert links.state("lo") is LinkState.DOWN  # the file says up; the host wins
    assert links.state("ens9") is LinkState.UP
    assert links.state("nope0") is LinkState.ABSENT
    waiter = asyncio.create_task(links.next_change(timeout_s=5))
    host.change.set()
    assert await asyncio.wait_for(waiter, WITHIN)
    links.close()
    assert host.closed


async def test_next_change_times_out_false_without_changes() -> None:
    links = SimLinkMonitor(_node_with_lo(), None)
    assert not await links.next_change(timeout_s=0.05)


class FailingHostLinks(FakeHostLinks):
    """A host link monitor whose netlink socket fails once `change` is set."""

    async def next_change(self, timeout_s: float) -> bool:
        await asyncio.wait_for(self.change.wait(), timeout_s)
        raise BackendError("netlink link monitor failed: test")


async def test_host_monitor_failure_surfaces_from_next_change() -> None:
    host = FailingHostLinks()
    links = SimLinkMonitor(_node_with_lo(), host)
    waiter = asyncio.create_task(links.next_change(timeout_s=5))
    host.change.set()
    with pytest.raises(BackendError, match="test"):
        await asyncio.wait_for(waiter, WITHIN)
    links.close()


async def test_host_change_while_nobody_waits_is_taken_by_the_next_wait() -> None:
    host = FakeHostLinks()
    links = SimLinkMonitor(_node_with_lo(), host)
    assert not await links.next_change(timeout_s=0.01)  # the host is followed from now on
    host.change.set()
    assert await asyncio.wait_for(links.next_change(timeout_s=5), WITHIN)
    links.close()
    assert host.closed
