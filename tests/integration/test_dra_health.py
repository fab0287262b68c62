"""DRA mode's health as device-plugin mode's: a NIC whose link goes down in the kernel (a
veth) leaves the roce slice within 3 s and comes back on link up; a lost GPU leaves and
comes back after a reset, the kubelet's DRAResourceHealth stream saying so; the node's
condition and Event on the API server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.api import dra_health_pb2
from agents.roce.dra import nic_name
from tests.conditions import PROCESS_WAIT as WAIT
from tests.integration.dra_node import GPU, NIC, NODE, DraNode, dra_node
from tests.timing import SHORT
from tests.veth import ip, node_on_netdev, veth_pair

__all__ = ["dra_node"]

FAULT_OUT_WITHIN = 3.0  # docs/dra.md: an Unhealthy device leaves its slice within 3 s
PEER = "drapeer0"


@pytest.fixture
def veth() -> Iterator[tuple[str, str]]:
    with veth_pair("dra", "na-dra", PEER) as pair:
        yield pair


@pytest.mark.netns
@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"
)
async def test_a_nic_whose_link_goes_down_leaves_the_roce_slice_and_returns_on_link_up(
    dra_node: DraNode, veth: tuple[str, str], tmp_path: Path
) -> None:
    host, netns = veth
    node_file, node = node_on_netdev(tmp_path, host)
    await dra_node.start(node_file)
    nic = nic_name(node["nics"][0]["pci"])
    assert dra_node.devices(NIC)[nic]["attributes"]["ifName"] == {"string": host}

    began = time.monotonic()
    ip("-n", netns, "link", "set", PEER, "down")
    await dra_node.wait(lambda: nic not in dra_node.devices(NIC))
    took = time.monotonic() - began
    print(f"link down -> out of the roce slice after {took * 1000:.0f} ms")
    assert took < FAULT_OUT_WITHIN
    assert len(dra_node.devices(NIC)) == len(node["nics"]) - 1

    ip("-n", netns, "link", "set", PEER, "up")
    await dra_node.wait(lambda: nic in dra_node.devices(NIC))
    assert len(dra_node.devices(NIC)) == len(node["nics"])


async def _collect(node: DraNode, device: str, seen: list[int]) -> None:
    """Appends each change of `device`'s health that the stream reports."""
    async for message in node.kubelet.watch_health(GPU):
        for state in message.devices:
            if state.device.device_name == device and (not seen or seen[-1] != state.health):
                seen.append(state.health)


@contextlib.asynccontextmanager
async def watching(node: DraNode, device: str) -> AsyncIterator[list[int]]:
    seen: list[int] = []
    task = asyncio.ensure_future(_collect(node, device, seen))
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_lost_gpu_leaves_its_slice_and_returns_after_a_reset_as_the_health_stream_says(
    dra_node: DraNode, node_file: Path, edit_node: Callable[..., None]
) -> None:
    await dra_node.start(node_file)
    healthy, unhealthy = dra_health_pb2.HEALTHY, dra_health_pb2.UNHEALTHY
    async with watching(dra_node, "gpu-4") as seen:
        await dra_node.wait(lambda: seen == [healthy])
        began = time.monotonic()
        edit_node(lambda d: d["gpus"][4].__setitem__("lost", True))
        await dra_node.wait(lambda: "gpu-4" not in dra_node.devices(GPU))
        took = time.monotonic() - began
        print(f"GPU lost -> out of the slice after {took * 1000:.0f} ms")
        assert took < FAULT_OUT_WITHIN
        await dra_node.wait(lambda: seen == [healthy, unhealthy])
        edit_node(lambda d: d["gpus"][4].__setitem__("lost", False))  # the reset
        await dra_node.wait(lambda: "gpu-4" in dra_node.devices(GPU), WAIT + SHORT.gpu_hold_s)
        await dra_node.wait(lambda: seen == [healthy, unhealthy, healthy])
    assert len(dra_node.devices(GPU)) == 8


async def test_an_xid_sets_the_node_condition_and_posts_an_event_in_dra_mode(
    dra_node: DraNode, node_file: Path, node_doc: dict[str, Any], edit_node: Callable[..., None]
) -> None:
    await dra_node.start(node_file)
    store = dra_node.server.store

    def condition() -> dict[str, Any]:
        return store.condition(NODE, "DevicesHealthy") or {}

    await dra_node.wait(lambda: condition().get("status") == "True")
    edit_node(lambda d: d["gpus"][1].update(xids=[79]))
    await dra_node.wait(lambda: condition().get("status") == "False")
    await dra_node.wait(lambda: store.event_list("default")["items"] != [])
    [event] = store.event_list("default")["items"]
    victim = node_doc["gpus"][1]["uuid"]
    assert f"{victim} (GPU 1) is Unhealthy: XID 79 (fell off the bus)" in event["message"]
    assert "gpu-1" not in dra_node.devices(GPU)
