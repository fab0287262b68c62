"""The fabric labels of a node: its leaf group (the leaves' names, or their hash where the
names make no label value), its spine from the config's map, and the label keys."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.core.fabric_place import (
    LEAF_GROUP,
    SPINE,
    TIER_0,
    TIER_1,
    Place,
    fabric_labels,
    fnv1a64,
    is_label_value,
    leaf_group,
    place_of,
    spine_of,
)

VALID_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


@pytest.mark.parametrize(
    ("data", "expected"),
    [(b"", 0xCBF29CE484222325), (b"a", 0xAF63DC4C8601EC8C), (b"foobar", 0x85944171F73967E8)],
    ids=["empty", "a", "foobar"],
)
def test_fnv1a64_matches_the_published_test_vectors(data: bytes, expected: int) -> None:
    assert fnv1a64(data) == expected


@pytest.mark.parametrize(
    ("leaves", "expected"),
    [
        ([], None),
        ([""], None),
        (["leaf-a"], "leaf-a"),
        (["leaf-b", "leaf-a", "leaf-b"], "leaf-a.leaf-b"),
        (["rack7-tor2", "rack7-tor1"], "rack7-tor1.rack7-tor2"),
        (["b8:59:9f:00:00:01"], f"x{fnv1a64(b'b8:59:9f:00:00:01'):016x}"),
        (["a" * 40, "b" * 40], f"x{fnv1a64(('a' * 40 + '.' + 'b' * 40).encode()):016x}"),
        (["a" * 63], "a" * 63),
    ],
    ids=["none", "empty-name", "one", "two-sorted-unique", "tor-pair", "mac", "too-long", "63"],
)
def test_leaf_group_joins_sorted_leaves_or_hashes_what_is_no_label_value(
    leaves: list[str], expected: str | None
) -> None:
    assert leaf_group(leaves) == expected


@given(st.lists(st.text(min_size=1, max_size=80), min_size=1, max_size=8))
def test_leaf_group_is_always_a_valid_label_value_and_ignores_order(leaves: list[str]) -> None:
    group = leaf_group(leaves)
    assert group is not None and VALID_VALUE.match(group)
    assert leaf_group(reversed(leaves)) == group


SPINES = {"leaf-a": "spine-1", "leaf-b": "spine-1", "leaf-c": "spine-2"}


@pytest.mark.parametrize(
    ("leaves", "expected"),
    [
        (["leaf-a"], "spine-1"),
        (["leaf-a", "leaf-b"], "spine-1"),
        (["leaf-a", "leaf-c"], None),
        (["leaf-a", "leaf-x"], None),
        (["leaf-x"], None),
        ([], None),
    ],
    ids=["one", "same-spine", "different-spines", "one-unmapped", "unmapped", "no-leaf"],
)
def test_spine_only_when_every_leaf_maps_to_the_same_one(
    leaves: list[str], expected: str | None
) -> None:
    assert spine_of(leaves, SPINES) == expected


@pytest.mark.parametrize(
    ("place", "keys", "expected"),
    [
        (None, ["node-agents", "topograph"], {}),
        (Place("leaf-a", None), ["node-agents"], {LEAF_GROUP: "leaf-a"}),
        (Place("leaf-a", "s1"), ["node-agents"], {LEAF_GROUP: "leaf-a", SPINE: "s1"}),
        (Place("leaf-a", "s1"), ["topograph"], {TIER_0: "leaf-a", TIER_1: "s1"}),
        (
            Place("leaf-a", "s1"),
            ["node-agents", "topograph"],
            {LEAF_GROUP: "leaf-a", SPINE: "s1", TIER_0: "leaf-a", TIER_1: "s1"},
        ),
        (Place("leaf-a", "s1"), [], {}),
    ],
    ids=["unknown", "no-spine", "node-agents", "topograph", "both", "no-keys"],
)
def test_fabric_labels_follow_the_chosen_key_sets(
    place: Place | None, keys: list[str], expected: dict[str, str]
) -> None:
    assert fabric_labels(place, keys) == expected


def test_place_of_no_leaves_is_unknown_and_of_leaves_has_group_and_spine() -> None:
    assert place_of([], SPINES) is None
    assert place_of(["leaf-b", "leaf-a"], SPINES) == Place("leaf-a.leaf-b", "spine-1")


@pytest.mark.parametrize(
    ("text", "valid"),
    [("a", True), ("a.b-c_d", True), ("-a", False), ("a-", False), ("", False), ("a" * 64, False)],
)
def test_is_label_value(text: str, valid: bool) -> None:
    assert is_label_value(text) is valid
