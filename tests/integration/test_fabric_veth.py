"""The fabric end to end on real frames: two NICs whose netdevs are veths, each cabled to a
'leaf switch' in a network namespace of its own that sends LLDP frames, and the agent's
feature file carrying the leaf group they make, hashed when the names do not fit a label."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml

from agents.backends import simulated_backends
from agents.config import Config
from agents.core.fabric_place import LEAF_GROUP
from agents.daemon import Agent
from agents.plugin.api import DevicePlugins
from agents.sim.bundled import bundled_node
from tests.conditions import WAIT, async_wait_until
from tests.lldp_frames import PeerSender, frame
from tests.veth import veth_pair

pytestmark = pytest.mark.netns

PEER = "swp1"


def fnv1a_64(text: str) -> int:
    """FNV-1a, 64 bits, written out here so that the test does not take the agent's word."""
    value = 0xCBF29CE484222325
    for byte in text.encode():
        value = ((value ^ byte) * 0x100000001B3) % 2**64
    return value


def features(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


@pytest.fixture
def two_leaves(tmp_path: Path) -> Iterator[tuple[Path, list[PeerSender]]]:
    """A node of 8 GPUs and two NICs on veths; a sender at each veth's far end."""
    with ExitStack() as stack:
        ends = [stack.enter_context(veth_pair(f"fab{i}", "nafab", PEER)) for i in range(2)]
        node = yaml.safe_load(bundled_node("h100-8gpu-8nic").read_text())
        node["nics"] = node["nics"][:2]
        for nic, (host, _) in zip(node["nics"], ends, strict=True):
            nic["netdev"] = host
            nic.pop("lldp", None)  # what they hear comes from the wire
        node_file = tmp_path / "node.yaml"
        node_file.write_text(yaml.safe_dump(node, sort_keys=False))
        senders = [stack.enter_context(PeerSender(netns, PEER)) for _, netns in ends]
        yield node_file, senders


async def test_two_nics_on_two_leaves_make_the_leaf_group_and_a_long_name_is_hashed(
    two_leaves: tuple[Path, list[PeerSender]], tmp_path: Path, plugin_dir: Path
) -> None:
    node_file, (nic0, nic1) = two_leaves
    path = tmp_path / "features.d" / "node-agents"
    async with simulated_backends(node_file) as backends:
        agent = Agent(
            Config.default(), "<test>", DevicePlugins(plugin_dir), backends, nfd_features_file=path
        )
        stop = asyncio.Event()
        task = asyncio.ensure_future(agent.run(stop))
        try:
            await async_wait_until(lambda: "node-agents.io/roce.count" in features(path), WAIT)
            nic0.send(frame(system_name="leaf-a", port_name="Ethernet1/1"))
            nic1.send(frame(system_name="leaf-b", port_name="Ethernet1/1"))
            await async_wait_until(
                lambda: features(path).get(LEAF_GROUP) == "leaf-a.leaf-b", WAIT, "two leaves"
            )

            long_name = "leaf-" + "b" * 70  # 75 characters: no label value
            nic1.send(frame(system_name=long_name))
            hashed = f"x{fnv1a_64('leaf-a.' + long_name):016x}"
            await async_wait_until(
                lambda: features(path).get(LEAF_GROUP) == hashed, WAIT, "hashed group"
            )
            assert len(hashed) == 17

            nic1.send(frame(system_name="leaf-a"))  # recabled to the first leaf
            await async_wait_until(
                lambda: features(path).get(LEAF_GROUP) == "leaf-a", WAIT, "one leaf"
            )
        finally:
            stop.set()
            await asyncio.wait_for(task, WAIT)
