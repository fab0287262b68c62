"""`node-agent fabric`'s formats from Node labels: the table, the Kueue Topology and the
Volcano HyperNodes, with and without NVLink domains, and the names it gives objects."""

from __future__ import annotations

import re

import pytest

from agents.fabric import object_name

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
