"""Free devices and pairs across the cluster, and whether what a pod got is paired: the
judge of every mode, from the layouts' truth alone (never from what the agents publish)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hack.clusterlib.layouts import Layout, Place
from hack.clusterlib.workload import Shape

GROUPINGS = ("switch", "root")  # what a pair's constraint matches on
COUNTS = "counts"  # no grouping: the device plugins' view


def group_of(place: Place, grouping: str) -> str | None:
    return place.switch if grouping == "switch" else place.root


def free_pairs(free: Iterable[Place], grouping: str) -> int:
    """How many disjoint GPU/NIC pairs of one group the free devices of a node make."""
    gpus: Counter[str] = Counter()
    nics: Counter[str] = Counter()
    for place in free:
        group = group_of(place, grouping)
        if group is not None:
            (gpus if place.kind == "gpu" else nics)[group] += 1
    return sum(min(n, nics[g]) for g, n in gpus.items())


def fits(shape: Shape, free: Sequence[Place], grouping: str) -> bool:
    """Whether one node's free devices meet a shape's request: pairs within one group
    (`grouping`), or by COUNTS as many GPUs and NICs as the shape has pairs."""
    if shape.paired and grouping == COUNTS:
        kinds = Counter(p.kind for p in free)
        return kinds["gpu"] >= shape.size and kinds["nic"] >= shape.size
    if shape.paired:
        return free_pairs(free, grouping) >= shape.size
    return sum(1 for p in free if p.kind == "gpu") >= shape.size


class Cluster:
    """Every node's layout and which of its devices are in use."""

    def __init__(self, layouts: Mapping[str, Layout]) -> None:
        self.layouts = dict(layouts)
        self._by_dra = {node: lay.by_dra() for node, lay in self.layouts.items()}
        self._by_id = {node: lay.by_plugin_id() for node, lay in self.layouts.items()}

    def total_gpus(self) -> int:
        return sum(len(lay.of("gpu")) for lay in self.layouts.values())

    def place(self, node: str, driver: str, device: str) -> Place:
        return self._by_dra[node][(driver, device)]

    def place_by_id(self, node: str, device_id: str) -> Place:
        return self._by_id[node][device_id]

    def free(self, used: Mapping[str, set[Place]]) -> dict[str, list[Place]]:
        """Node -> its devices not in `used` (node -> places)."""
        return {
            node: [p for p in lay.places if p not in used.get(node, set())]
            for node, lay in self.layouts.items()
        }

    def fits_somewhere(
        self, shape: Shape, used: Mapping[str, set[Place]], grouping: str
    ) -> str | None:
        """A node whose free devices meet the request, if any."""
        for node, free in self.free(used).items():
            if fits(shape, free, grouping):
                return node
        return None


@dataclass(frozen=True)
class Allocation:
    """What one claim got: the node and, by request name, the device's place."""

    node: str
    devices: Mapping[str, Place]


def allocation_of(claim: Mapping[str, Any], cluster: Cluster) -> Allocation | None:
    """A ResourceClaim's allocation read against the layouts (None: not allocated).
    Each result names its driver, pool (the node, one pool per driver and node) and device."""
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        return None
    results = allocation.get("devices", {}).get("results") or []
    devices, nodes = {}, set()
    for result in results:
        node = str(result["pool"])
        nodes.add(node)
        devices[str(result["request"])] = cluster.place(node, result["driver"], result["device"])
    if len(nodes) != 1:
        raise ValueError(f"claim allocated across pools {sorted(nodes)}: one node expected")
    return Allocation(nodes.pop(), devices)


def pairs_of(allocation: Allocation) -> list[tuple[Place, Place]]:
    """The (GPU, NIC) of each pair a claim asked for: requests gpu-i and nic-i."""
    got = allocation.devices
    return [
        (got[r], got["nic-" + r[4:]])
        for r in sorted(got)
        if r.startswith("gpu-") and "nic-" + r[4:] in got
    ]


def claim_paired(allocation: Allocation) -> bool:
    """Every pair of the claim shares a PCIe switch."""
    pairs = pairs_of(allocation)
    return bool(pairs) and all(g.switch is not None and g.switch == n.switch for g, n in pairs)


def devices_paired(gpus: Iterable[Place], nics: Iterable[Place]) -> bool:
    """Whether the GPUs and NICs a container got split into pairs that each share a PCIe
    switch: as many GPUs as NICs under every switch, none without one."""
    count: Counter[str | None] = Counter()
    for g in gpus:
        count[g.switch] += 1
    for n in nics:
        count[n.switch] -= 1
    return None not in count and not any(count.values())
