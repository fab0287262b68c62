"""A flapping link, through the kernel's netlink and the whole agent, reaches the
API-server stand-in as one Warning and one Normal Event whose counts add up to the
changes the kubelet was told of, not one object per flap."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agents.backends import simulated_backends
from agents.cluster.client import Access, ApiClient
from agents.cluster.reporter import Reporter
from agents.config import Config
from agents.daemon import Agent
from agents.families import parse_families
from agents.plugin.api import DevicePlugins
from agents.roce.family import RoceFamily
from agents.standin.kubelet import Kubelet
from tests.conditions import WAIT, async_wait_until
from tests.families import running_family
from tests.standin.apiserver import ApiServer
from tests.timing import SHORT
from tests.veth import node_on_netdev, veth_pair

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"
    ),
]

NODE = "roce-node-1"
NIC = "rdma/roce"
PEER = "naflpeer0"
FLAP_S = 0.2  # the link is down this long, then up this long


@pytest.fixture
def veth() -> Iterator[tuple[str, str]]:
    with veth_pair("nafl", "na-flap", PEER) as pair:
        yield pair


@dataclass
class Running:
    agent: Agent
    kubelet: Kubelet
    server: ApiServer
    pci: str
    netns: str
    told: list[bool] = field(default_factory=list)  # the NIC's health as the kubelet got it

    def health(self) -> str | None:
        view = self.kubelet.resource(NIC)
        state = view.devices.get(self.pci) if view is not None else None
        return state.health if state is not None else None

    def counts(self) -> dict[str, int]:
        items: list[dict[str, Any]] = self.server.store.event_list("default")["items"]
        return {e["reason"]: e["count"] for e in items}

    def objects(self) -> int:
        return len(self.server.store.event_list("default")["items"])

    async def link(self, state: str) -> None:
        proc = await asyncio.create_subprocess_exec(
            "ip", "-n", self.netns, "link", "set", PEER, state
        )
        assert await proc.wait() == 0


async def _follow(running: Running) -> None:
    """Record every change of the NIC's health in the agent's device list."""
    inventory = running_family(running.agent, RoceFamily).resources()[0].inventory
    while True:
        version = inventory.version
        device = inventory.get(running.pci)
        if device is not None and (not running.told or running.told[-1] != device.healthy):
            running.told.append(device.healthy)
        await inventory.wait_newer(version)


@pytest.fixture
async def running(veth: tuple[str, str]) -> AsyncIterator[Running]:
    host, netns = veth
    with tempfile.TemporaryDirectory(prefix="na-flap-") as work:
        node_file, node = node_on_netdev(Path(work), host)
        kubelet, server = Kubelet(Path(work) / "plugins", seed=1), ApiServer((NODE,))
        await kubelet.start()
        await server.start()
        reporter = Reporter(NODE, ApiClient(Access(server.url)))
        stop = asyncio.Event()
        async with simulated_backends(node_file) as backends:
            agent = Agent(
                Config.default(),
                "<test>",
                DevicePlugins(kubelet.plugin_dir),
                backends,
                parse_families("roce"),
                reporter=reporter,
                timing=SHORT,
            )
            await agent.start()
            task = asyncio.ensure_future(agent.run(stop))
            run = Running(agent, kubelet, server, node["nics"][0]["pci"], netns)
            follower = asyncio.ensure_future(_follow(run))
            try:
                await kubelet.wait_until(lambda _: run.health() == "Healthy", WAIT)
                await async_wait_until(
                    lambda: server.store.condition(NODE, "DevicesHealthy") is not None, WAIT
                )
                yield run
            finally:
                follower.cancel()
                stop.set()
                await task
        await kubelet.stop()
        await server.stop()


async def test_each_flap_the_kubelet_sees_is_counted_into_two_events(running: Running) -> None:
    flaps = 3
    for _ in range(flaps):
        await running.link("down")
        await running.kubelet.wait_until(
            lambda _: running.health() == "Unhealthy", SHORT.nic_flap_hold_s + WAIT
        )
        await running.link("up")
        await running.kubelet.wait_until(
            lambda _: running.health() == "Healthy", SHORT.nic_flap_hold_s + WAIT
        )
    await async_wait_until(
        lambda: running.counts() == {"DeviceUnhealthy": flaps, "DeviceHealthy": flaps}, WAIT
    )
    assert running.objects() == 2
    condition = running.server.store.condition(NODE, "DevicesHealthy")
    assert condition is not None and condition["status"] == "True"


async def test_twenty_flaps_make_two_events_whose_counts_add_up(running: Running) -> None:
    for _ in range(20):
        await running.link("down")
        await asyncio.sleep(FLAP_S)  # the rhythm of the flapping link, not a wait for it
        await running.link("up")
        await asyncio.sleep(FLAP_S)
    # The agent holds later flaps of a NIC for the flap hold after a change it reported:
    # wait until it has published the last state (up) and the API server has it all.
    await running.kubelet.wait_until(
        lambda _: running.health() == "Healthy", SHORT.nic_flap_hold_s + WAIT
    )
    down = running.told.count(False)
    up = running.told.count(True) - 1  # the first entry is the state at start
    await async_wait_until(
        lambda: running.counts() == {"DeviceUnhealthy": down, "DeviceHealthy": up}, WAIT
    )
    objects = running.objects()
    print(f"\n20 flaps: the kubelet was told {down} down and {up} up; {objects} Event objects")
    assert running.objects() <= 2
    assert down == up
