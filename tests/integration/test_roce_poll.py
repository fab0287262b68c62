"""The RoCE family's poll: the RDMA port state is a second signal beside the link state,
and polls that find nothing new send nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.config import Config
from agents.hw.netlink import LinkState
from agents.roce.family import RoceFamily
from agents.sim.links import SimLinkMonitor
from agents.sim.simnode import SimulatedNode
from agents.tasks import until
from tests.conditions import async_wait_until
from tests.families import roce_family


class SteppedLinks:
    """A LinkMonitor whose polls the test drives: each tick() ends one wait, reporting no
    link change; states come from the simulated node."""

    def __init__(self, inner: SimLinkMonitor) -> None:
        self._inner = inner
        self._ticks: asyncio.Queue[None] = asyncio.Queue()
        self.polls = 0

    def tick(self) -> None:
        self._ticks.put_nowait(None)

    def state(self, ifname: str) -> LinkState:
        return self._inner.state(ifname)

    async def next_change(self, timeout_s: float) -> bool:
        await self._ticks.get()
        self.polls += 1
        return False

    def close(self) -> None:
        self._inner.close()


@dataclass
class Polled:
    family: RoceFamily
    links: SteppedLinks
    node: SimulatedNode

    async def polls_done(self, n: int) -> None:
        """Wait until n ticks were taken and the refresh after the last one has run: the
        loop is back waiting, which it does only after refreshing."""
        for _ in range(n):
            self.links.tick()
        await async_wait_until(lambda: self.links.polls >= n, what=f"{n} polls")
        self.links.tick()  # taken only once the n-th refresh is over
        await async_wait_until(lambda: self.links.polls >= n + 1, what="refresh done")

    def port_file(self, rdma: str) -> Path:
        return self.node.tree.sys / "class/infiniband" / rdma / "ports/1/state"


@pytest.fixture
async def polled(node_file: Path, tmp_path: Path) -> AsyncIterator[Polled]:
    node = SimulatedNode(node_file, tmp_path / "root")
    node.load()
    links = SteppedLinks(node.links)
    family = roce_family(node.sysfs, links, Config.default())
    stop = asyncio.Event()
    task = asyncio.ensure_future(until(stop, family.run))
    try:
        yield Polled(family, links, node)
    finally:
        stop.set()
        links.tick()
        await asyncio.wait_for(task, 5)


async def test_polls_of_an_unchanged_node_leave_the_device_list_untouched(
    polled: Polled,
) -> None:
    inventory = polled.family.resources()[0].inventory
    version = inventory.version
    await polled.polls_done(3)
    assert inventory.version == version
    assert all(d.healthy for d in inventory.devices)


async def test_a_port_down_with_its_link_up_is_unhealthy_at_the_next_poll(
    polled: Polled,
) -> None:
    inventory = polled.family.resources()[0].inventory
    nic = polled.family.nics[3]
    assert polled.links.state(nic.netdev) is LinkState.UP
    polled.port_file(nic.rdma).write_text("1: DOWN\n")
    await polled.polls_done(1)
    unhealthy = {d.id for d in inventory.devices if not d.healthy}
    assert unhealthy == {nic.pci}
