"""`node-agent fabric`: the cluster's spines, leaf groups and NVLink domains from its
Nodes' labels, as a table, a Kueue Topology or Volcano HyperNodes for `kubectl apply`."""

from __future__ import annotations

import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from agents.core.fabric_place import LEAF_GROUP, SPINE, TIER_0, TIER_1, fnv1a64
from agents.errors import AgentError

FORMATS = ("table", "kueue", "volcano")
HOSTNAME = "kubernetes.io/hostname"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
VOLCANO_API = "topology.volcano.sh/v1alpha1"
TOPOLOGY_NAME = "node-agents-fabric"
CLIQUE = "nvidia.com/gpu.clique"  # the NVLink domain, as GFD (and our agent) label it
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")  # an object name (DNS subdomain)
# Volcano checks a HyperNode member's exactMatch name as a qualified name: at most 63.
_NAME_MAX = 63


@dataclass(frozen=True)
class Keys:
    """The label keys a cluster's Nodes carry: ours, or topograph's."""

    leaf_group: str
    spine: str


OURS, TOPOGRAPH = Keys(LEAF_GROUP, SPINE), Keys(TIER_0, TIER_1)


Place = tuple[str | None, str]  # (spine or None, leaf group)
Part = tuple[str | None, str, str]  # (spine or None, leaf group, NVLink domain)
_K = TypeVar("_K", Place, Part)


@dataclass(frozen=True)
class Fabric:
    """Nodes by place: (spine, leaf group) -> node count, and of those nodes the ones in an
    NVLink domain: (spine, leaf group, domain) -> node count."""

    keys: Keys
    groups: Mapping[Place, int]
    unlabelled: int  # nodes without a leaf group
    domains: Mapping[Part, int] = field(default_factory=dict)
    spans: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # domain -> its groups

    @property
    def has_spines(self) -> bool:
        return any(spine is not None for spine, _ in self.groups)


def fabric_of(nodes: Iterable[Mapping[str, Any]]) -> Fabric:
    """Group Nodes (API objects) by their fabric labels: ours where any Node has them,
    else topograph's. A Node without a leaf group counts only as unlabelled."""
    labels = [dict((n.get("metadata") or {}).get("labels") or {}) for n in nodes]
    theirs = any(TIER_0 in lb for lb in labels) and not any(LEAF_GROUP in lb for lb in labels)
    keys = TOPOGRAPH if theirs else OURS
    groups: Counter[Place] = Counter()
    domains: Counter[Part] = Counter()
    for lb in labels:
        if keys.leaf_group in lb:
            place = (lb.get(keys.spine), str(lb[keys.leaf_group]))
            groups[place] += 1
            if CLIQUE in lb:
                domains[(*place, str(lb[CLIQUE]))] += 1
    unlabelled = sum(1 for lb in labels if keys.leaf_group not in lb)
    return Fabric(keys, _sorted(groups), unlabelled, _sorted(domains), _spans(domains))


def _sorted(counts: Counter[_K]) -> dict[_K, int]:
    return dict(sorted(counts.items(), key=lambda kv: tuple(v or "" for v in kv[0])))


def _spans(domains: Iterable[Part]) -> dict[str, tuple[str, ...]]:
    """The NVLink domains whose nodes are under more than one leaf group, with those."""
    groups: dict[str, set[str]] = {}
    for _, group, clique in domains:
        groups.setdefault(clique, set()).add(group)
    return {c: tuple(sorted(gs)) for c, gs in sorted(groups.items()) if len(gs) > 1}


def warnings(fabric: Fabric) -> list[str]:
    """Where the fabric does not fit the schedulers' model: NVLink domains under more than
    one leaf group (Kueue's and Volcano's levels must nest)."""
    return [
        f"NVLink domain {clique} spans leaf groups {', '.join(groups)}; Kueue and Volcano "
        "take its nodes under each leaf group for a domain of their own"
        for clique, groups in fabric.spans.items()
    ]


def table(fabric: Fabric) -> str:
    """Nodes per spine and leaf group; where the cluster has NVLink domains, per spine,
    leaf group and domain (`-`: the group's nodes in none)."""
    rows: list[tuple[str, ...]]
    if fabric.domains:
        rows = [("SPINE", "LEAF GROUP", "NVLINK DOMAIN", "NODES"), *_domain_rows(fabric)]
    else:
        rows = [("SPINE", "LEAF GROUP", "NODES")]
        rows += [(spine or "-", group, str(n)) for (spine, group), n in fabric.groups.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = [
        "  ".join([*(f"{c:<{w}}" for c, w in zip(r[:-1], widths, strict=True)), r[-1]])
        for r in rows
    ]
    lines.append(f"nodes without a leaf group: {fabric.unlabelled}")
    keys = [fabric.keys.leaf_group, fabric.keys.spine, *([CLIQUE] if fabric.domains else [])]
    lines.append(f"labels: {', '.join(keys)}")
    return "\n".join(lines) + "\n"


def _domain_rows(fabric: Fabric) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for (spine, group), n in fabric.groups.items():
        parts = [(c, m) for (s, g, c), m in fabric.domains.items() if (s, g) == (spine, group)]
        if n > sum(m for _, m in parts):
            rows.append((spine or "-", group, "-", str(n - sum(m for _, m in parts))))
        rows += [(spine or "-", group, clique, str(m)) for clique, m in parts]
    return rows


def kueue(fabric: Fabric) -> str:
    """A Kueue Topology, highest level first: spine (where any Node has one), leaf group,
    NVLink domain (where any Node with a leaf group has one), host."""
    levels = [fabric.keys.spine] if fabric.has_spines else []
    levels += [fabric.keys.leaf_group, *([CLIQUE] if fabric.domains else []), HOSTNAME]
    topology = {
        "apiVersion": KUEUE_API,
        "kind": "Topology",
        "metadata": {"name": TOPOLOGY_NAME},
        "spec": {"levels": [{"nodeLabel": level} for level in levels]},
    }
    return yaml.safe_dump(topology, sort_keys=False)


def volcano(fabric: Fabric) -> str:
    """Volcano HyperNodes, tier 1 the lowest: one per NVLink domain where the cluster has
    any (its Nodes, by label), per leaf group (its domains' HyperNodes and its other
    Nodes) and per spine (its leaf groups' HyperNodes)."""
    leaf_tier = 2 if fabric.domains else 1
    docs = [_hypernode(name, 1, [member]) for name, member in _domain_members(fabric).items()]
    spines: dict[str, list[str]] = {}
    for spine, group in fabric.groups:
        name = object_name("leaf", group)
        if spine is not None:
            spines.setdefault(spine, []).append(name)
        if any(d["metadata"]["name"] == name for d in docs):
            continue  # one leaf group under several spines (nodes disagree): one HyperNode
        docs.append(_hypernode(name, leaf_tier, _leaf_members(fabric, group)))
    for spine, leaves in spines.items():
        members = [_child(n) for n in leaves]
        docs.append(_hypernode(object_name("spine", spine), leaf_tier + 1, members))
    return yaml.safe_dump_all(docs, sort_keys=False) if docs else ""


def _domain_members(fabric: Fabric) -> dict[str, dict[str, Any]]:
    """Per NVLink domain under a leaf group, its HyperNode's name and Nodes. A domain
    under several groups gets one per group: a HyperNode has one parent."""
    members: dict[str, dict[str, Any]] = {}
    for _, group, clique in fabric.domains:
        match = {fabric.keys.leaf_group: group, CLIQUE: clique}
        members[domain_name(fabric, group, clique)] = _nodes({"matchLabels": match})
    return members


def domain_name(fabric: Fabric, group: str, clique: str) -> str:
    """`nvlink-<domain>`; `nvlink-<domain>-<group>` (hashed) where it spans groups."""
    if clique in fabric.spans:
        return object_name("nvlink", f"{clique}/{group}")  # '/' is in no label value
    return object_name("nvlink", clique)


def _leaf_members(fabric: Fabric, group: str) -> list[dict[str, Any]]:
    """A leaf group's HyperNode: its domains' HyperNodes and its Nodes in none (all its
    Nodes, by label, where it has no domain)."""
    cliques = sorted({c for _, g, c in fabric.domains if g == group})
    own = {"matchLabels": {fabric.keys.leaf_group: group}}
    if not cliques:
        return [_nodes(own)]
    members = [_child(domain_name(fabric, group, c)) for c in cliques]
    in_domains = sum(n for (_, g, _), n in fabric.domains.items() if g == group)
    if sum(n for (_, g), n in fabric.groups.items() if g == group) > in_domains:
        outside = [{"key": CLIQUE, "operator": "DoesNotExist"}]
        members.append(_nodes({**own, "matchExpressions": outside}))
    return members


def _nodes(selector: dict[str, Any]) -> dict[str, Any]:
    return {"type": "Node", "selector": {"labelMatch": selector}}


def _child(name: str) -> dict[str, Any]:
    return {"type": "HyperNode", "selector": {"exactMatch": {"name": name}}}


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
    fabric = fabric_of(listing.items)
    for warning in warnings(fabric):
        print(f"node-agent fabric: {warning}", file=sys.stderr)
    sys.stdout.write(RENDER[output](fabric))
    return 0
