"""Where a node sits in the fabric, from the leaf switches its RoCE NICs are cabled to:
its leaf group, its spine, and the node labels that say so (docs/fabric.md)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

NODE_AGENTS, TOPOGRAPH = "node-agents", "topograph"
LABEL_KEY_SETS = (NODE_AGENTS, TOPOGRAPH)  # what `fabric.labelKeys` may name
LEAF_GROUP = "network.node-agents.io/leaf-group"
SPINE = "network.node-agents.io/spine"
TIER_0 = "fabric.topograph.run/tier-0"  # topograph's name for the leaf group
TIER_1 = "fabric.topograph.run/tier-1"  # and for the spine
KEYS: dict[str, tuple[str, str]] = {NODE_AGENTS: (LEAF_GROUP, SPINE), TOPOGRAPH: (TIER_0, TIER_1)}
ALL_KEYS = tuple(key for pair in KEYS.values() for key in pair)  # every label this sets

_VALID = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")
_FNV_OFFSET, _FNV_PRIME, _MASK = 0xCBF29CE484222325, 0x100000001B3, (1 << 64) - 1


def is_label_value(text: str) -> bool:
    """A non-empty Kubernetes label value: at most 63 of [A-Za-z0-9._-], alphanumeric ends."""
    return _VALID.fullmatch(text) is not None


def fnv1a64(data: bytes) -> int:
    """FNV-1a, 64 bits."""
    h = _FNV_OFFSET
    for byte in data:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK
    return h


def leaf_group(leaves: Iterable[str]) -> str | None:
    """The leaves' names, unique and sorted, joined by '.'; where that is no label value,
    `x` and the 16 hex digits of its FNV-1a hash. None without a leaf."""
    names = sorted({leaf for leaf in leaves if leaf})
    if not names:
        return None
    joined = ".".join(names)
    return joined if is_label_value(joined) else f"x{fnv1a64(joined.encode()):016x}"


def spine_of(leaves: Iterable[str], spines: Mapping[str, str]) -> str | None:
    """The one spine every leaf maps to. None when a leaf is unmapped or the leaves map
    to different spines: the node is then under no single spine, and saying one would
    place a job's stages across spines that the scheduler thinks are one."""
    mapped = {spines.get(leaf) for leaf in leaves if leaf}
    if len(mapped) != 1 or None in mapped:
        return None
    return mapped.pop()


@dataclass(frozen=True)
class Place:
    """A node's place in the fabric."""

    leaf_group: str
    spine: str | None


def place_of(leaves: Iterable[str], spines: Mapping[str, str]) -> Place | None:
    """The node's place from the leaves its NICs hear; None when they hear none."""
    names = [leaf for leaf in leaves if leaf]
    group = leaf_group(names)
    return None if group is None else Place(group, spine_of(names, spines))


def fabric_labels(place: Place | None, label_keys: Iterable[str]) -> dict[str, str]:
    """The node labels of `place` under each named key set (unknown names are skipped)."""
    out: dict[str, str] = {}
    if place is None:
        return out
    for name in label_keys:
        group_key, spine_key = KEYS.get(name, ("", ""))
        if not group_key:
            continue
        out[group_key] = place.leaf_group
        if place.spine is not None:
            out[spine_key] = place.spine
    return out
