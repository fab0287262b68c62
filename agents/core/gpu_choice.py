"""Preferred allocation: which k GPUs are best connected, and which time-shared
replicas spread the load over the GPUs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from agents.core.budget import Expired, never
from agents.core.subsets import PairCosts, cheapest
from agents.core.topology import Distance


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
    gpus: Iterable[str], nvlinks: Mapping[frozenset[str], int], pcie: Callable[[str, str], Distance]
) -> PairCosts:
    """One cost per pair, lower is better: an NVLink outweighs the PCIe distances of every
    pair of a set of all these GPUs, so summed over a set the two rank lexicographically."""
    ids = sorted(set(gpus))
    nvlink_weight = int(Distance.SYS) * len(ids) * (len(ids) - 1) // 2 + 1

    def cost(a: str, b: str) -> int:
        return int(pcie(a, b)) - nvlinks.get(frozenset((a, b)), 0) * nvlink_weight

    return PairCosts.of(ids, cost)


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
