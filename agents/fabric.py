"""`node-agent fabric`: the cluster's leaf groups and spines from its Nodes' labels, as a
table, a Kueue Topology or Volcano HyperNodes ready for `kubectl apply`."""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agents.core.fabric_place import LEAF_GROUP, SPINE, TIER_0, TIER_1, fnv1a64
from agents.errors import AgentError

FORMATS = ("table", "kueue", "volcano")
HOSTNAME = "kubernetes.io/hostname"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
VOLCANO_API = "topology.volcano.sh/v1alpha1"
TOPOLOGY_NAME = "node-agents-fabric"
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")  # an object name (DNS subdomain)
# Volcano checks a HyperNode member's exactMatch name as a qualified name: at most 63.
_NAME_MAX = 63


@dataclass(frozen=True)
class Keys:
    """The label keys a cluster's Nodes carry: ours, or topograph's."""

    leaf_group: str
    spine: str


OURS, TOPOGRAPH = Keys(LEAF_GROUP, SPINE), Keys(TIER_0, TIER_1)


@dataclass(frozen=True)
class Fabric:
    """Nodes by place: (spine or None, leaf group) -> node count."""

    keys: Keys
    groups: Mapping[tuple[str | None, str], int]
    unlabelled: int  # nodes without a leaf group

    @property
    def has_spines(self) -> bool:
        return any(spine is not None for spine, _ in self.groups)


def fabric_of(nodes: Iterable[Mapping[str, Any]]) -> Fabric:
    """Group Nodes (API objects) by their fabric labels: ours where any Node has them,
    else topograph's."""
    labels = [dict((n.get("metadata") or {}).get("labels") or {}) for n in nodes]
    theirs = any(TIER_0 in lb for lb in labels) and not any(LEAF_GROUP in lb for lb in labels)
    keys = TOPOGRAPH if theirs else OURS
    counts: Counter[tuple[str | None, str]] = Counter()
    for lb in labels:
        if keys.leaf_group in lb:
            counts[(lb.get(keys.spine), str(lb[keys.leaf_group]))] += 1
    unlabelled = sum(1 for lb in labels if keys.leaf_group not in lb)
    return Fabric(keys, dict(sorted(counts.items(), key=_order)), unlabelled)


def _order(item: tuple[tuple[str | None, str], int]) -> tuple[str, str]:
    (spine, group), _ = item
    return spine or "", group


def table(fabric: Fabric) -> str:
    rows = [("SPINE", "LEAF GROUP", "NODES")]
    rows += [(spine or "-", group, str(n)) for (spine, group), n in fabric.groups.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = [f"{s:<{widths[0]}}  {g:<{widths[1]}}  {n}" for s, g, n in rows]
    lines.append(f"nodes without a leaf group: {fabric.unlabelled}")
    lines.append(f"labels: {fabric.keys.leaf_group}, {fabric.keys.spine}")
    return "\n".join(lines) + "\n"


def kueue(fabric: Fabric) -> str:
    """A Kueue Topology: spine (where any Node has one), leaf group, host."""
    levels = [fabric.keys.spine] if fabric.has_spines else []
    levels += [fabric.keys.leaf_group, HOSTNAME]
    topology = {
        "apiVersion": KUEUE_API,
        "kind": "Topology",
        "metadata": {"name": TOPOLOGY_NAME},
        "spec": {"levels": [{"nodeLabel": level} for level in levels]},
    }
    return yaml.safe_dump(topology, sort_keys=False)


def volcano(fabric: Fabric) -> str:
    """Volcano HyperNodes: tier 1 per leaf group (its Nodes, by label), tier 2 per spine
    (its leaf groups' HyperNodes)."""
    docs: list[dict[str, Any]] = []
    spines: dict[str, list[str]] = {}
    for spine, group in fabric.groups:
        name = object_name("leaf", group)
        if spine is not None:
            spines.setdefault(spine, []).append(name)
        if any(d["metadata"]["name"] == name for d in docs):
            continue  # one leaf group under several spines (nodes disagree): one HyperNode
        match = {"labelMatch": {"matchLabels": {fabric.keys.leaf_group: group}}}
        docs.append(_hypernode(name, 1, [{"type": "Node", "selector": match}]))
    for spine, leaves in spines.items():
        members = [{"type": "HyperNode", "selector": {"exactMatch": {"name": n}}} for n in leaves]
        docs.append(_hypernode(object_name("spine", spine), 2, members))
    return yaml.safe_dump_all(docs, sort_keys=False) if docs else ""


def _hypernode(name: str, tier: int, members: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": VOLCANO_API,
        "kind": "HyperNode",
        "metadata": {"name": name},
        "spec": {"tier": tier, "members": members},
    }


def object_name(kind: str, value: str) -> str:
    """`kind-value` as an object name; a value that makes none (capitals, `_`, over 63
    characters) is cut to what does and given a hash of itself, so that two values never
    share a name."""
    name = f"{kind}-{value}"
    if len(name) <= _NAME_MAX and _NAME.fullmatch(name):
        return name
    cut = re.sub(r"[^a-z0-9.-]+", "-", value.lower()).strip("-.")
    cut = cut[: _NAME_MAX - len(kind) - 10].rstrip("-.")  # room for the dashes and the hash
    return f"{kind}-{cut}-{fnv1a64(value.encode()) & 0xFFFFFFFF:08x}"


RENDER = {"table": table, "kueue": kueue, "volcano": volcano}


async def show_fabric(kubeconfig: Path | None, output: str, env: Mapping[str, str]) -> int:
    """List the Nodes and print their fabric in `output` format."""
    from agents.cluster import required_access
    from agents.cluster.client import ApiClient, ApiError, UnreachableError

    access = await required_access("fabric", kubeconfig, env)
    async with ApiClient(access) as client:
        try:
            listing = await client.list("/api/v1/nodes")
        except (ApiError, UnreachableError) as exc:
            raise AgentError(f"listing Nodes: {exc}") from exc
    sys.stdout.write(RENDER[output](fabric_of(listing.items)))
    return 0
