"""The fabric on a simulated node: its NICs' LLDP neighbours become the leaf-group label
in the feature file and on the Node (--label-node), and leaf attributes in the DRA
slices; edits of the neighbours are followed; a node without LLDP gets no fabric labels,
serves as before and says `fabric_unknown` once."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any

import yaml
from structlog.testing import capture_logs

from agents.backends import simulated_backends
from agents.config import Config, Fabric
from agents.core.fabric_place import LEAF_GROUP, SPINE, TIER_0, TIER_1
from agents.daemon import Agent
from agents.plugin.api import DevicePlugins
from agents.roce.family import RoceFamily, discover_nics
from agents.sim.bundled import bundled_node
from tests.conditions import WAIT, async_wait_until
from tests.integration.dra_node import NIC, NODE, DraNode, dra_node

__all__ = ["dra_node"]

LEAF_SWITCH, LEAF_PORT = "node-agents.io/leafSwitch", "node-agents.io/leafPort"


def features(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    return dict(line.split("=", 1) for line in path.read_text().splitlines())


def rename_leaf(old: str, new: str) -> Callable[[dict[str, Any]], None]:
    def change(doc: dict[str, Any]) -> None:
        for nic in doc["nics"]:
            if nic["lldp"]["systemName"] == old:
                nic["lldp"]["systemName"] = new

    return change


def no_lldp(doc: dict[str, Any]) -> None:
    for nic in doc["nics"]:
        nic.pop("lldp", None)


async def test_feature_file_follows_the_neighbours_in_the_node_file(
    tmp_path: Path, node_file: Path, plugin_dir: Path, edit_node: Callable[..., None]
) -> None:
    path = tmp_path / "features.d" / "node-agents"
    spines = Fabric((("leaf-a", "spine-1"), ("leaf-b", "spine-1")), ("node-agents", "topograph"))
    config = Config(fabric=spines)
    async with simulated_backends(node_file) as backends:
        agent = Agent(config, "<test>", DevicePlugins(plugin_dir), backends, nfd_features_file=path)
        stop = asyncio.Event()
        task = asyncio.ensure_future(agent.run(stop))
        try:
            await async_wait_until(lambda: LEAF_GROUP in features(path), WAIT, "leaf group")
            labels = features(path)
            assert labels[LEAF_GROUP] == labels[TIER_0] == "leaf-a.leaf-b"
            assert labels[SPINE] == labels[TIER_1] == "spine-1"
            assert labels["node-agents.io/roce.count"] == "8"

            edit_node(rename_leaf("leaf-b", "leaf-c"))  # recabled: leaf-c maps to no spine
            await async_wait_until(
                lambda: features(path).get(LEAF_GROUP) == "leaf-a.leaf-c", WAIT, "renamed"
            )
            assert SPINE not in features(path) and TIER_1 not in features(path)

            edit_node(no_lldp)
            await async_wait_until(lambda: LEAF_GROUP not in features(path), WAIT, "gone")
            assert not {TIER_0, SPINE, TIER_1} & set(features(path))
            assert features(path)["node-agents.io/roce.healthy"] == "8"
        finally:
            stop.set()
            await asyncio.wait_for(task, WAIT)


async def test_a_node_without_lldp_gets_no_fabric_labels_and_says_fabric_unknown_once(
    tmp_path: Path,
) -> None:
    node_file = tmp_path / "node.yaml"
    shutil.copy(bundled_node("h100-8gpu-4nic"), node_file)
    async with simulated_backends(node_file) as backends:
        found = discover_nics(backends.sysfs, Config.default())
        family = RoceFamily(
            backends.sysfs,
            backends.links,
            found,
            Config.default(),
            lldp=backends.lldp,
            unknown_after_s=0.2,  # the agent waits 60 s
        )
        with capture_logs() as logs:
            task = asyncio.ensure_future(family.run())

            def said() -> list[MutableMapping[str, Any]]:
                return [e for e in logs if e["event"] == "fabric_unknown"]

            await async_wait_until(said, WAIT, "fabric_unknown")
            assert family.labels() == {"roce.count": "4", "roce.healthy": "4"}
            assert all(LEAF_SWITCH not in d.attributes for d in family.facts().devices)

            # Heard, then lost again: said once more, after the same wait.
            doc = yaml.safe_load(node_file.read_text())
            nic = doc["nics"][0]
            nic["lldp"] = {"systemName": "leaf-z", "chassisId": "00:11", "portId": "Eth1"}
            assert backends.simulated is not None
            backends.simulated.neighbours.update(_parsed(doc))
            await async_wait_until(lambda: LEAF_GROUP in family.labels(), WAIT, "heard")
            assert [e["event"] for e in logs if e["event"].startswith("fabric_")][-1:] == [
                "fabric_neighbours"
            ]
            backends.simulated.neighbours.update(backends.simulated.spec)
            await async_wait_until(lambda: len(said()) == 2, WAIT, "second fabric_unknown")
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        assert len(said()) == 2
        assert [e["event"] for e in logs].count("fabric_known") == 1


def _parsed(doc: dict[str, Any]) -> Any:
    from agents.sim.node import parse_node

    return parse_node(yaml.safe_dump(doc), "edited")


async def test_dra_slices_and_the_node_labels_carry_the_leaves_and_follow_edits(
    dra_node: DraNode, node_file: Path, edit_node: Callable[..., None]
) -> None:
    agent = await dra_node.start(node_file, "--label-node")
    store = dra_node.server.store

    def leaf(device: str) -> tuple[str, str] | None:
        attributes = dra_node.devices(NIC)[device]["attributes"]
        if LEAF_SWITCH not in attributes:
            return None
        return attributes[LEAF_SWITCH]["string"], attributes[LEAF_PORT]["string"]

    def node_label() -> str | None:
        value = store.node(NODE)["metadata"].get("labels", {}).get(LEAF_GROUP)
        return None if value is None else str(value)

    await dra_node.wait(lambda: leaf("nic-0000-19-00-0") is not None)
    assert leaf("nic-0000-19-00-0") == ("leaf-a", "Ethernet1/1")  # ens1np0
    assert leaf("nic-0000-99-00-0") == ("leaf-b", "Ethernet1/1")  # ens5np0
    await dra_node.wait(lambda: node_label() == "leaf-a.leaf-b")
    # Only the fabric's keys and GFD's: our other keys unset, none of the Node's touched.
    [(_, first)] = store.label_patches[:1]
    gfd = {key for key in first if key.startswith("nvidia.com/")}
    assert "nvidia.com/gpu.count" in gfd
    assert set(first) - gfd == {LEAF_GROUP, SPINE, TIER_0, TIER_1}
    assert first[SPINE] is None and first[TIER_0] is None

    edit_node(rename_leaf("leaf-b", "leaf-c"))
    await dra_node.wait(lambda: leaf("nic-0000-99-00-0") == ("leaf-c", "Ethernet1/1"))
    await dra_node.wait(lambda: node_label() == "leaf-a.leaf-c")

    edit_node(no_lldp)
    await dra_node.wait(lambda: leaf("nic-0000-19-00-0") is None)
    await dra_node.wait(lambda: node_label() is None)
    assert len(dra_node.devices(NIC)) == 8
    assert agent.terminate() == 0
