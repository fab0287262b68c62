"""The fabric and the API server: `--label-node` patches only the fabric's keys onto the
Node and waits out an API server that is down; `node-agent fabric` reads the Nodes'
labels back as a table, a Kueue Topology and Volcano HyperNodes, NVLink domains too."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import structlog
import yaml

from agents.cluster import node_labeller
from agents.cluster.access import Access
from agents.cluster.client import ApiClient
from agents.cluster.node_labeller import NodeLabeller
from agents.core.fabric_place import LEAF_GROUP, SPINE, TIER_0, TIER_1
from agents.fabric import CLIQUE
from agents.kernel.catalogue import Inventory
from tests.conditions import WAIT, async_wait_until
from tests.standin.apiserver import REFUSE, UP, ApiServer, write_kubeconfig


async def test_label_node_patches_only_fabric_keys_and_outlasts_an_api_server_down(
    server: ApiServer,
) -> None:
    server.store.node("node-1")["metadata"]["labels"] = {"team": "a", TIER_0: "stale"}
    await server.set_mode(REFUSE)
    labels = {LEAF_GROUP: "leaf-a", "node-agents.io/roce.count": "8"}
    inventory = Inventory()
    client = ApiClient(Access(server.url), timeout_s=0.5)
    labeller = NodeLabeller("node-1", client, first_retry_s=0.05, max_retry_s=0.2)

    task = asyncio.ensure_future(labeller.run(lambda: labels, [inventory]))
    try:
        await async_wait_until(lambda: labeller._failing, WAIT, "a failed patch")
        await server.set_mode(UP)

        def node_labels() -> dict[str, str]:
            return dict(server.store.node("node-1")["metadata"]["labels"])

        await async_wait_until(lambda: LEAF_GROUP in node_labels(), WAIT, "patched")
        # Ours set, the stale topograph key removed, the Node's own label kept.
        assert node_labels() == {"team": "a", LEAF_GROUP: "leaf-a"}

        patches = len(server.store.label_patches)
        inventory.touch()  # nothing new to say: no call
        labels[SPINE] = "spine-1"
        labels.pop(LEAF_GROUP)
        await async_wait_until(lambda: SPINE in node_labels(), WAIT, "changed")
        assert node_labels() == {"team": "a", SPINE: "spine-1"}
        assert len(server.store.label_patches) == patches + 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await client.aclose()


NODES = {
    "gpu-1": {LEAF_GROUP: "leaf-a.leaf-b", SPINE: "spine-1"},
    "gpu-2": {LEAF_GROUP: "leaf-a.leaf-b", SPINE: "spine-1"},
    "gpu-3": {LEAF_GROUP: "leaf-c", SPINE: "spine-1"},
    "gpu-4": {LEAF_GROUP: "Leaf_D"},
    "cpu-1": {},
}


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Path]:
    server = ApiServer(())
    for name, labels in NODES.items():
        server.store.add_node(name, labels)
    await server.start()
    yield write_kubeconfig(tmp_path / "kubeconfig", server.url)
    await server.stop()


async def fabric(kubeconfig: Path, *more: str) -> str:
    """`node-agent fabric` in a process, the stand-in answering meanwhile."""
    return await asyncio.to_thread(_fabric, kubeconfig, *more)


def _fabric(kubeconfig: Path, *more: str) -> str:
    return _run_fabric(kubeconfig, *more).stdout


def _run_fabric(kubeconfig: Path, *more: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    done = subprocess.run(
        [sys.executable, "-m", "agents.cli", "fabric", "--kubeconfig", str(kubeconfig), *more],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


async def test_fabric_table_counts_nodes_per_spine_and_leaf_group(cluster: Path) -> None:
    rows = [line.split() for line in (await fabric(cluster)).splitlines()]
    assert rows[:4] == [
        ["SPINE", "LEAF", "GROUP", "NODES"],
        ["-", "Leaf_D", "1"],
        ["spine-1", "leaf-a.leaf-b", "2"],
        ["spine-1", "leaf-c", "1"],
    ]
    assert rows[4] == ["nodes", "without", "a", "leaf", "group:", "1"]


async def test_fabric_kueue_topology_has_spine_leaf_group_and_host_levels(cluster: Path) -> None:
    topology = yaml.safe_load(await fabric(cluster, "--format", "kueue"))
    assert topology["apiVersion"] == "kueue.x-k8s.io/v1beta2"
    assert topology["kind"] == "Topology"
    levels = [level["nodeLabel"] for level in topology["spec"]["levels"]]
    assert levels == [SPINE, LEAF_GROUP, "kubernetes.io/hostname"]


async def test_fabric_volcano_hypernodes_tier_leaf_groups_under_spines(cluster: Path) -> None:
    docs = {
        d["metadata"]["name"]: d
        for d in yaml.safe_load_all(await fabric(cluster, "--format", "volcano"))
    }
    assert {d["apiVersion"] for d in docs.values()} == {"topology.volcano.sh/v1alpha1"}
    leaf = docs["leaf-leaf-a.leaf-b"]["spec"]
    assert leaf["tier"] == 1
    assert leaf["members"] == [
        {"type": "Node", "selector": {"labelMatch": {"matchLabels": {LEAF_GROUP: "leaf-a.leaf-b"}}}}
    ]
    [odd] = [n for n in docs if n.startswith("leaf-leaf_d") or n.startswith("leaf-leaf-d-")]
    assert docs[odd]["spec"]["members"][0]["selector"]["labelMatch"]["matchLabels"] == {
        LEAF_GROUP: "Leaf_D"
    }
    spine = docs["spine-spine-1"]["spec"]
    assert spine["tier"] == 2
    assert [m["selector"]["exactMatch"]["name"] for m in spine["members"]] == [
        "leaf-leaf-a.leaf-b",
        "leaf-leaf-c",
    ]
    assert all(m["type"] == "HyperNode" for m in spine["members"])


async def test_fabric_reads_topographs_keys_where_the_nodes_carry_only_those(
    tmp_path: Path,
) -> None:
    server = ApiServer(())
    server.store.add_node("n1", {TIER_0: "leaf-a", TIER_1: "s1"})
    await server.start()
    try:
        kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", server.url)
        topology = yaml.safe_load(await fabric(kubeconfig, "--format", "kueue"))
        levels = [level["nodeLabel"] for level in topology["spec"]["levels"]]
        assert levels == [TIER_1, TIER_0, "kubernetes.io/hostname"]
    finally:
        await server.stop()


RACK_1 = "0f3e5a2c-6b1d-4c8e-9a7f-2d4b6c8e0a12.1"
RACK_2 = "0f3e5a2c-6b1d-4c8e-9a7f-2d4b6c8e0a12.2"
NVL72 = {  # two GB200 racks: rack 1 under leaf-a, rack 2 across leaf-b and leaf-c
    **{f"gb-{i}": {LEAF_GROUP: "leaf-a", SPINE: "spine-1", CLIQUE: RACK_1} for i in range(3)},
    "gb-3": {LEAF_GROUP: "leaf-b", SPINE: "spine-1", CLIQUE: RACK_2},
    "gb-4": {LEAF_GROUP: "leaf-c", SPINE: "spine-1", CLIQUE: RACK_2},
    "h100-1": {LEAF_GROUP: "leaf-a", SPINE: "spine-1"},
}


@pytest.fixture
async def racks(tmp_path: Path) -> AsyncIterator[Path]:
    server = ApiServer(())
    for name, labels in NVL72.items():
        server.store.add_node(name, labels)
    await server.start()
    yield write_kubeconfig(tmp_path / "kubeconfig", server.url)
    await server.stop()


async def test_fabric_with_cliques_adds_the_nvlink_domain_to_every_format(racks: Path) -> None:
    done = await asyncio.to_thread(_run_fabric, racks)
    rows = [line.split() for line in done.stdout.splitlines()]
    assert rows[:6] == [
        ["SPINE", "LEAF", "GROUP", "NVLINK", "DOMAIN", "NODES"],
        ["spine-1", "leaf-a", "-", "1"],
        ["spine-1", "leaf-a", RACK_1, "3"],
        ["spine-1", "leaf-b", RACK_2, "1"],
        ["spine-1", "leaf-c", RACK_2, "1"],
        ["nodes", "without", "a", "leaf", "group:", "0"],
    ]
    topology = yaml.safe_load(await fabric(racks, "--format", "kueue"))
    levels = [level["nodeLabel"] for level in topology["spec"]["levels"]]
    assert levels == [SPINE, LEAF_GROUP, CLIQUE, "kubernetes.io/hostname"]
    docs = {
        d["metadata"]["name"]: d["spec"]
        for d in yaml.safe_load_all(await fabric(racks, "--format", "volcano"))
    }
    assert docs[f"nvlink-{RACK_1}"]["tier"] == 1
    assert docs[f"nvlink-{RACK_1}"]["members"][0]["selector"]["labelMatch"]["matchLabels"] == {
        LEAF_GROUP: "leaf-a",
        CLIQUE: RACK_1,
    }
    leaf_a = docs["leaf-leaf-a"]
    assert leaf_a["tier"] == 2
    assert [m["type"] for m in leaf_a["members"]] == ["HyperNode", "Node"]
    assert docs["spine-spine-1"]["tier"] == 3


async def test_fabric_warns_on_stderr_of_a_domain_across_leaf_groups(racks: Path) -> None:
    for output in ("table", "kueue", "volcano"):
        done = await asyncio.to_thread(_run_fabric, racks, "--format", output)
        assert done.stderr.splitlines() == [
            f"node-agent fabric: NVLink domain {RACK_2} spans leaf groups leaf-b, leaf-c; "
            "Kueue and Volcano take its nodes under each leaf group for a domain of their own"
        ], output


async def test_fabric_without_cliques_writes_nothing_on_stderr(cluster: Path) -> None:
    done = await asyncio.to_thread(_run_fabric, cluster, "--format", "volcano")
    assert done.stderr == ""
    assert "nvlink-" not in done.stdout


def test_fabric_without_api_access_is_a_usage_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "agents.cli", "fabric", "--kubeconfig", str(tmp_path / "none")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--kubeconfig" in done.stderr


@pytest.mark.parametrize(
    ("kubeconfig", "env", "reason"),
    [
        (None, {"NODE_NAME": "n1"}, "no API access"),
        ("missing", {"NODE_NAME": "n1"}, "API server access"),
        (None, {}, "without a node name"),
    ],
    ids=["no-access", "unreadable-kubeconfig", "no-node-name"],
)
async def test_label_node_without_api_or_name_leaves_labels_to_the_feature_file(
    tmp_path: Path, kubeconfig: str | None, env: dict[str, str], reason: str
) -> None:
    # The DaemonSet passes --label-node; a node whose agent cannot reach its Node must
    # still serve its devices (a crash loop would take them off the node).
    path = None if kubeconfig is None else tmp_path / kubeconfig
    with structlog.testing.capture_logs() as logs:
        assert await node_labeller(path, None, env) is None
    (said,) = [e for e in logs if e["event"] == "node_labels_off"]
    assert reason in said["reason"]
