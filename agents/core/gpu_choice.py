"""Preferred allocation: which k GPUs are best connected, and which time-shared
replicas spread the load over the GPUs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from agents.core.budget import Expired, never
from agents.core.subsets import PairCosts, cheapest
from agents.core.topology import Distance

PcieDistances = Callable[[str, str], Distance] | Mapping[frozenset[str], Distance]


def choose_gpus(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    nvlinks: Mapping[frozenset[str], int],
    pcie: PcieDistances,
) -> list[str]:
    """The `size` GPUs, `must_include` among them, with the most NVLinks between
    pairs, then the smallest sum of PCIe distances, then the smallest sorted IDs.

    Missing NVLink pairs count as 0 links, missing PCIe pairs as SYS.
    """
    _check_request(available, must_include, size)
    return choose(available, must_include, size, gpu_pair_costs(available, nvlinks, pcie))


def choose(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    costs: PairCosts,
    *,
    expired: Expired = never,
) -> list[str]:
    """The `size` devices, `must_include` among them, with the smallest sum of pair
    costs, then the smallest sorted IDs; `costs` covers every available device.
    Once `expired`, the cheapest set found so far."""
    fixed = sorted(must_include)
    pool = set(available) - set(must_include)
    extra = cheapest(fixed, pool, size - len(fixed), costs, expired=expired)
    return sorted([*fixed, *extra])


def gpu_pair_costs(
    gpus: Iterable[str], nvlinks: Mapping[frozenset[str], int], pcie: PcieDistances
) -> PairCosts:
    """One cost per pair, lower is better: an NVLink outweighs the PCIe distances of every
    pair of a set of all these GPUs, so summed over a set the two rank lexicographically."""
    ids = sorted(set(gpus))
    nvlink_weight = int(Distance.SYS) * len(ids) * (len(ids) - 1) // 2 + 1
    lookup = pcie if callable(pcie) else _mapping_lookup(pcie)

    def cost(a: str, b: str) -> int:
        return int(lookup(a, b)) - nvlinks.get(frozenset((a, b)), 0) * nvlink_weight

    return PairCosts.of(ids, cost)


def _check_request(available: Sequence[str], must_include: Sequence[str], size: int) -> None:
    if len(set(available)) != len(available):
        raise ValueError("available device IDs repeat")
    if len(set(must_include)) != len(must_include):
        raise ValueError("must-include device IDs repeat")
    missing = set(must_include) - set(available)
    if missing:
        raise ValueError(f"must-include devices not available: {sorted(missing)}")
    if not len(must_include) <= size <= len(available):
        raise ValueError(
            f"cannot choose {size} of {len(available)} devices with {len(must_include)} required"
        )


def _mapping_lookup(table: Mapping[frozenset[str], Distance]) -> Callable[[str, str], Distance]:
    def lookup(a: str, b: str) -> Distance:
        return table.get(frozenset((a, b)), Distance.SYS)

    return lookup


def spread_replicas(
    available_replicas: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    gpu_of: Callable[[str], str],
    in_use: Mapping[str, int],
    packed: bool = False,
) -> list[str]:
    """`size` replicas, `must_include` among them, each next one on a GPU this
    request does not use yet where possible, then on the least loaded GPU; of one
    GPU, the lowest replica number first (`packed`: see `spread_over`).

    `in_use` counts the replicas of each GPU held by other containers.
    """
    _check_request(available_replicas, must_include, size)
    free_by_gpu: dict[str, list[str]] = {}
    for replica in sorted(set(available_replicas) - set(must_include), key=replica_order):
        free_by_gpu.setdefault(gpu_of(replica), []).append(replica)
    return spread_over(free_by_gpu, must_include, size, gpu_of=gpu_of, in_use=in_use, packed=packed)


def replica_order(replica: str) -> tuple[int, str]:
    """Replica IDs by number: `gpu::2` before `gpu::10`."""
    return (len(replica), replica)


def spread_over(
    free_by_gpu: Mapping[str, Sequence[str]],
    must_include: Sequence[str],
    size: int,
    *,
    gpu_of: Callable[[str], str],
    in_use: Mapping[str, int],
    packed: bool = False,
) -> list[str]:
    """The choice of `spread_replicas`, from each GPU's free replicas other than
    `must_include`, lowest number first; the first `size` of each are enough.

    `packed` turns the spreading round: each next replica comes from the GPU with the
    most replicas in use, this request's included, so that other GPUs stay free.
    """
    picked = list(must_include)
    mine = Counter(gpu_of(r) for r in picked)
    # Every replica of one GPU ranks alike, so the choice is a GPU, then its lowest
    # replica number: one pass over the GPUs per pick, not over every replica.
    queues = {gpu: list(reversed(free)) for gpu, free in free_by_gpu.items() if free}

    def rank(gpu: str) -> tuple[int, int, str]:
        if packed:
            return (-(in_use.get(gpu, 0) + mine[gpu]), 0, gpu)
        return (mine[gpu], in_use.get(gpu, 0) + mine[gpu], gpu)

    while len(picked) < size:
        gpu = min(queues, key=rank)
        picked.append(queues[gpu].pop())
        if not queues[gpu]:
            del queues[gpu]
        mine[gpu] += 1
    return picked
