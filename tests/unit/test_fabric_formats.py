"""`node-agent fabric`'s formats from Node labels: the table, the Kueue Topology and the
Volcano HyperNodes, with and without NVLink domains, and the names it gives objects."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from agents.core.fabric_place import LEAF_GROUP, SPINE, TIER_0, TIER_1
from agents.fabric import CLIQUE, HOSTNAME, fabric_of, kueue, object_name, table, volcano, warnings

QUALIFIED = re.compile(r"[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?")  # and a DNS subdomain


@pytest.mark.parametrize(
    ("kind", "value", "expected"),
    [
        ("leaf", "leaf-a.leaf-b", "leaf-leaf-a.leaf-b"),
        ("leaf", "a" * 58, "leaf-" + "a" * 58),
        ("leaf", "a" * 59, None),
        ("leaf", "Leaf_D", None),
        (
            "nvlink",
            "0f3e5a2c-6b1d-4c8e-9a7f-2d4b6c8e0a12.1",
            "nvlink-0f3e5a2c-6b1d-4c8e-9a7f-2d4b6c8e0a12.1",
        ),
        ("nvlink", "0F3E5A2C-6B1D-4C8E-9A7F-2D4B6C8E0A12.1", None),
    ],
    ids=["valid", "63-long", "64-long-hashed", "capitals-hashed", "clique", "clique-capitals"],
)
def test_object_name_is_kind_value_or_a_hashed_cut_of_at_most_63(
    kind: str, value: str, expected: str | None
) -> None:
    name = object_name(kind, value)
    assert QUALIFIED.fullmatch(name), name
    if expected is not None:
        assert name == expected
    else:
        assert re.fullmatch(rf"{kind}-[-a-z0-9.]*-[0-9a-f]{{8}}", name), name
        assert name != object_name(kind, value + "x")  # the hash tells values apart


UUID = "0f3e5a2c-6b1d-4c8e-9a7f-2d4b6c8e0a12"
RACK_1, RACK_2 = f"{UUID}.1", f"{UUID}.2"
Labels = dict[str, str]


def nodes(*labels: Labels) -> list[dict[str, Any]]:
    return [{"metadata": {"name": f"n{i}", "labels": lb}} for i, lb in enumerate(labels)]


def at(group: str, spine: str | None = "spine-1", clique: str | None = None) -> Labels:
    labels = {LEAF_GROUP: group}
    labels |= {SPINE: spine} if spine else {}
    return labels | ({CLIQUE: clique} if clique else {})


PLAIN = nodes(at("leaf-a"), at("leaf-a"), at("leaf-c"), at("Leaf_D", None), {})
# Rack 1 under leaf-a beside one node in no domain; rack 2 under leaf-b; leaf-c has none.
RACKS = nodes(
    *[at("leaf-a", clique=RACK_1)] * 3,
    at("leaf-a"),
    *[at("leaf-b", clique=RACK_2)] * 2,
    at("leaf-c"),
    {CLIQUE: RACK_2},
)
# Rack 2's nodes under two leaf groups: its NVLink domain spans them.
SPANNING = nodes(
    at("leaf-b", clique=RACK_2), at("leaf-b", clique=RACK_2), at("leaf-c", clique=RACK_2)
)


def rows(text: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line) for line in text.splitlines()]


@pytest.mark.parametrize(
    ("cluster", "expected"),
    [
        (
            PLAIN,
            [
                ["SPINE", "LEAF GROUP", "NODES"],
                ["-", "Leaf_D", "1"],
                ["spine-1", "leaf-a", "2"],
                ["spine-1", "leaf-c", "1"],
                ["nodes without a leaf group: 1"],
                [f"labels: {LEAF_GROUP}, {SPINE}"],
            ],
        ),
        (
            RACKS,
            [
                ["SPINE", "LEAF GROUP", "NVLINK DOMAIN", "NODES"],
                ["spine-1", "leaf-a", "-", "1"],
                ["spine-1", "leaf-a", RACK_1, "3"],
                ["spine-1", "leaf-b", RACK_2, "2"],
                ["spine-1", "leaf-c", "-", "1"],
                ["nodes without a leaf group: 1"],
                [f"labels: {LEAF_GROUP}, {SPINE}, {CLIQUE}"],
            ],
        ),
    ],
    ids=["without-cliques", "with-cliques"],
)
def test_table_counts_nodes_per_spine_leaf_group_and_nvlink_domain(
    cluster: list[dict[str, Any]], expected: list[list[str]]
) -> None:
    assert rows(table(fabric_of(cluster))) == expected


def test_table_without_cliques_is_aligned_as_before() -> None:
    assert table(fabric_of(nodes(at("leaf-a"), at("leaf-bb", None)))) == (
        "SPINE    LEAF GROUP  NODES\n"
        "-        leaf-bb     1\n"
        "spine-1  leaf-a      1\n"
        "nodes without a leaf group: 0\n"
        f"labels: {LEAF_GROUP}, {SPINE}\n"
    )


@pytest.mark.parametrize(
    ("cluster", "levels"),
    [
        (PLAIN, [SPINE, LEAF_GROUP, HOSTNAME]),
        (nodes(at("leaf-a", None)), [LEAF_GROUP, HOSTNAME]),
        (RACKS, [SPINE, LEAF_GROUP, CLIQUE, HOSTNAME]),
        (nodes(at("leaf-a", None, RACK_1)), [LEAF_GROUP, CLIQUE, HOSTNAME]),
        (
            nodes({TIER_0: "leaf-a", TIER_1: "s1", CLIQUE: RACK_1}),
            [TIER_1, TIER_0, CLIQUE, HOSTNAME],
        ),
        (nodes(at("leaf-a"), {CLIQUE: RACK_1}), [SPINE, LEAF_GROUP, HOSTNAME]),
        (SPANNING, [SPINE, LEAF_GROUP, CLIQUE, HOSTNAME]),
    ],
    ids=[
        "spine-leaf",
        "leaf",
        "with-cliques",
        "cliques-no-spine",
        "topograph-keys",
        "clique-only-off-the-fabric",
        "spanning",
    ],
)
def test_kueue_levels_run_from_spine_to_host_with_the_nvlink_domain_above_the_host(
    cluster: list[dict[str, Any]], levels: list[str]
) -> None:
    topology = yaml.safe_load(kueue(fabric_of(cluster)))
    assert topology["kind"] == "Topology"
    assert [level["nodeLabel"] for level in topology["spec"]["levels"]] == levels


def test_kueue_without_cliques_is_byte_for_byte_as_before() -> None:
    assert kueue(fabric_of(PLAIN)) == (
        "apiVersion: kueue.x-k8s.io/v1beta2\n"
        "kind: Topology\n"
        "metadata:\n"
        "  name: node-agents-fabric\n"
        "spec:\n"
        "  levels:\n"
        f"  - nodeLabel: {SPINE}\n"
        f"  - nodeLabel: {LEAF_GROUP}\n"
        f"  - nodeLabel: {HOSTNAME}\n"
    )


def hypernodes(cluster: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    docs = yaml.safe_load_all(volcano(fabric_of(cluster)))
    return {d["metadata"]["name"]: d["spec"] for d in docs}


def children(spec: dict[str, Any]) -> list[str]:
    return [
        m["selector"]["exactMatch"]["name"] for m in spec["members"] if m["type"] == "HyperNode"
    ]


def selects(spec: dict[str, Any], labels: Labels) -> bool:
    """Whether a HyperNode's Node members take a Node with these labels, as Volcano's
    label selectors do (matchLabels, and DoesNotExist expressions)."""
    for member in (m for m in spec["members"] if m["type"] == "Node"):
        match = member["selector"]["labelMatch"]
        absent = [
            e["key"] for e in match.get("matchExpressions", []) if e["operator"] == "DoesNotExist"
        ]
        assert len(absent) == len(match.get("matchExpressions", [])), "only DoesNotExist"
        if all(labels.get(k) == v for k, v in match["matchLabels"].items()) and not any(
            k in labels for k in absent
        ):
            return True
    return False


def test_volcano_without_cliques_tiers_leaf_groups_1_and_spines_2() -> None:
    docs = hypernodes(PLAIN)
    assert docs["leaf-leaf-a"] == {
        "tier": 1,
        "members": [
            {"type": "Node", "selector": {"labelMatch": {"matchLabels": {LEAF_GROUP: "leaf-a"}}}}
        ],
    }
    assert docs["spine-spine-1"]["tier"] == 2
    assert children(docs["spine-spine-1"]) == ["leaf-leaf-a", "leaf-leaf-c"]
    assert not any(name.startswith("nvlink-") for name in docs)


def test_volcano_with_cliques_puts_a_tier_1_domain_under_its_tier_2_leaf_group() -> None:
    docs = hypernodes(RACKS)
    rack_1, rack_2 = f"nvlink-{RACK_1}", f"nvlink-{RACK_2}"
    assert docs[rack_1] == {
        "tier": 1,
        "members": [
            {
                "type": "Node",
                "selector": {"labelMatch": {"matchLabels": {LEAF_GROUP: "leaf-a", CLIQUE: RACK_1}}},
            }
        ],
    }
    assert (docs[rack_2]["tier"], docs["leaf-leaf-a"]["tier"], docs["spine-spine-1"]["tier"]) == (
        1,
        2,
        3,
    )
    assert children(docs["leaf-leaf-a"]) == [rack_1]
    assert children(docs["leaf-leaf-b"]) == [rack_2]
    assert children(docs["leaf-leaf-c"]) == []
    assert children(docs["spine-spine-1"]) == ["leaf-leaf-a", "leaf-leaf-b", "leaf-leaf-c"]
    # leaf-a's node in no domain is its own member; its rack's nodes are not, twice.
    assert selects(docs["leaf-leaf-a"], at("leaf-a"))
    assert not selects(docs["leaf-leaf-a"], at("leaf-a", clique=RACK_1))
    assert len(docs["leaf-leaf-b"]["members"]) == 1  # every node of leaf-b is in rack 2


@pytest.mark.parametrize("cluster", [PLAIN, RACKS, SPANNING], ids=["plain", "racks", "spanning"])
def test_volcano_hypernodes_form_a_tree_each_node_in_one_lowest_hypernode(
    cluster: list[dict[str, Any]],
) -> None:
    docs = hypernodes(cluster)
    parents = [child for spec in docs.values() for child in children(spec)]
    assert sorted(parents) == sorted(set(parents)), "a HyperNode has one parent in Volcano"
    assert set(parents) <= set(docs)
    assert all(QUALIFIED.fullmatch(name) for name in docs)
    has_domains = any(name.startswith("nvlink-") for name in docs)
    for node in cluster:
        labels = node["metadata"]["labels"]
        direct = [name for name, spec in docs.items() if selects(spec, labels)]
        assert len(direct) == (1 if LEAF_GROUP in labels else 0), (labels, direct)
        # A node in a domain sits in a tier-1 one; the others in their leaf group's.
        tier = 1 if CLIQUE in labels or not has_domains else 2
        assert all(docs[d]["tier"] == tier for d in direct), (labels, direct)


def test_a_domain_spanning_leaf_groups_is_warned_of_and_split_under_each() -> None:
    fabric = fabric_of(SPANNING)
    assert warnings(fabric) == [
        f"NVLink domain {RACK_2} spans leaf groups leaf-b, leaf-c; Kueue and Volcano take "
        "its nodes under each leaf group for a domain of their own"
    ]
    docs = hypernodes(SPANNING)
    [under_b] = children(docs["leaf-leaf-b"])
    [under_c] = children(docs["leaf-leaf-c"])
    assert under_b != under_c
    assert under_b.startswith(f"nvlink-{UUID}.2-leaf-b-") and docs[under_b]["tier"] == 1
    assert selects(docs[under_c], at("leaf-c", clique=RACK_2))
    assert not selects(docs[under_c], at("leaf-b", clique=RACK_2))
    assert rows(table(fabric))[1:3] == [
        ["spine-1", "leaf-b", RACK_2, "2"],
        ["spine-1", "leaf-c", RACK_2, "1"],
    ]


def test_no_warning_where_each_domain_is_under_one_leaf_group() -> None:
    assert warnings(fabric_of(RACKS)) == []
    assert warnings(fabric_of(PLAIN)) == []
