"""NIC health from the host's real netlink, through the whole agent to the kubelet.

A veth whose host-side end is named as a simulated NIC's `netdev` stands in for that NIC:
its link state comes from the kernel, and its peer (in a namespace of its own) is what
the test takes down, brings up and deletes.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.backends import simulated_backends
from agents.config import Config
from agents.daemon import Agent
from agents.hw.netlink import LinkState, NetlinkMonitor
from agents.plugin.api import DevicePlugins
from agents.roce.family import RoceFamily
from agents.standin.kubelet import Kubelet
from tests.families import running_family
from tests.timing import SHORT
from tests.veth import node_on_netdev, veth_pair

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"
    ),
]

NIC = "rdma/roce"
FIRST_REPORT_S = 1.0  # a first change reaches the kubelet within this
PEER = "natpeer0"


@pytest.fixture
def veth() -> Iterator[tuple[str, str]]:
    with veth_pair("nat", "na-link", PEER) as pair:
        yield pair


@dataclass
class Running:
    agent: Agent
    kubelet: Kubelet
    pci: str  # the NIC whose netdev is the veth


@pytest.fixture
async def running(veth: tuple[str, str]) -> AsyncIterator[Running]:
    host, _ = veth
    with tempfile.TemporaryDirectory(prefix="na-link-") as work:
        node_file, node = node_on_netdev(Path(work), host)
        plugin_dir = Path(work) / "plugins"
        kubelet = Kubelet(plugin_dir, seed=1)
        await kubelet.start()
        stop = asyncio.Event()
        async with simulated_backends(node_file) as backends:
            agent = Agent(
                Config.default(), "<test>", DevicePlugins(plugin_dir), backends, timing=SHORT
            )
            await agent.start()
            task = asyncio.ensure_future(agent.run(stop))
            try:
                pci = node["nics"][0]["pci"]
                running = Running(agent, kubelet, pci)
                await kubelet.wait_until(lambda k: _health(k, pci) == "Healthy", 10)
                yield running
            finally:
                stop.set()
                await task
        await kubelet.stop()


def _health(kubelet: Kubelet, pci: str) -> str | None:
    view = kubelet.resource(NIC)
    state = view.devices.get(pci) if view is not None else None
    return state.health if state is not None else None


async def _change(
    running: Running, command: list[str], *, ifname: str, link: LinkState, want: str, within: float
) -> tuple[float, float]:
    """Run `ip <command>`; wait until the kubelet sees the NIC `want`.

    Returns (ms from the command to the kubelet's view, ms from the kernel's netlink event,
    as a monitor of our own receives it, to the agent's inventory change).
    """
    inventory = running_family(running.agent, RoceFamily).resources()[0].inventory
    monitor = NetlinkMonitor()
    seen_event = seen_inventory = 0.0

    async def kernel() -> None:
        nonlocal seen_event
        while monitor.state(ifname) is not link:
            await monitor.next_change(within)
        seen_event = time.monotonic()

    async def agent() -> None:
        nonlocal seen_inventory
        while (device := inventory.get(running.pci)) is None or device.healthy != (
            want == "Healthy"
        ):
            await inventory.wait_newer(inventory.version)
        seen_inventory = time.monotonic()

    watchers = [asyncio.ensure_future(kernel()), asyncio.ensure_future(agent())]
    try:
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec("ip", *command)
        assert await proc.wait() == 0, f"ip {' '.join(command)} failed"
        await running.kubelet.wait_until(lambda k: _health(k, running.pci) == want, within)
        seen_kubelet = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*watchers), within)
    finally:
        for task in watchers:
            task.cancel()
        monitor.close()
    return (seen_kubelet - started) * 1000, max(0.0, seen_inventory - seen_event) * 1000


async def test_peer_down_then_up_turns_the_nic_unhealthy_then_healthy(
    running: Running, veth: tuple[str, str]
) -> None:
    host, netns = veth
    down_ms, down_push_ms = await _change(
        running,
        ["-n", netns, "link", "set", PEER, "down"],
        ifname=host,
        link=LinkState.DOWN,
        want="Unhealthy",
        within=FIRST_REPORT_S,
    )
    # Back up within the flap hold: held, then published when the hold ends.
    up_ms, _ = await _change(
        running,
        ["-n", netns, "link", "set", PEER, "up"],
        ifname=host,
        link=LinkState.UP,
        want="Healthy",
        within=SHORT.nic_flap_hold_s + FIRST_REPORT_S,
    )
    print(
        f"\nlink down -> kubelet Unhealthy {down_ms:.1f} ms "
        f"(netlink event -> inventory {down_push_ms:.1f} ms); "
        f"up -> Healthy {up_ms:.1f} ms (flap hold {SHORT.nic_flap_hold_s:g} s)"
    )
    assert down_ms < FIRST_REPORT_S * 1000
    assert down_push_ms < FIRST_REPORT_S * 1000  # ~ms when idle; loose on a loaded machine


async def test_deleted_interface_turns_the_nic_unhealthy_at_once(
    running: Running, veth: tuple[str, str]
) -> None:
    host, _ = veth
    gone_ms, gone_push_ms = await _change(
        running,
        ["link", "del", host],
        ifname=host,
        link=LinkState.ABSENT,
        want="Unhealthy",
        within=FIRST_REPORT_S,
    )
    print(
        f"\ninterface deleted -> kubelet Unhealthy {gone_ms:.1f} ms "
        f"(netlink event -> inventory {gone_push_ms:.1f} ms)"
    )
    assert gone_ms < FIRST_REPORT_S * 1000
