"""Preferred allocation: which k GPUs are best connected, and which time-shared
replicas spread the load over the GPUs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from itertools import accumulate

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
    fixed = sorted(must_include)
    free = sorted(set(available) - set(must_include))
    ids = fixed + free
    weights = _pair_weights(ids, size, nvlinks, pcie)
    search = _Search(weights, len(fixed), size - len(fixed))
    return sorted(ids[i] for i in search.run())


def cheapest_subset(
    fixed: Sequence[str], free: Sequence[str], want: int, pair_cost: Callable[[str, str], int]
) -> tuple[int, list[str]]:
    """`want` of `free` that, with all of `fixed`, have the smallest sum of `pair_cost`
    over their pairs (ties: the smallest sorted free IDs), and that sum."""
    ids = [*fixed, *sorted(free)]
    n = len(ids)
    weights = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            weights[i][j] = weights[j][i] = pair_cost(ids[i], ids[j])
    search = _Search(weights, len(fixed), want)
    chosen = search.run()
    assert search.best is not None
    return search.best[0], [ids[i] for i in chosen]


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


def _pair_weights(
    ids: Sequence[str],
    size: int,
    nvlinks: Mapping[frozenset[str], int],
    pcie: PcieDistances,
) -> list[list[int]]:
    """One cost per pair, lower is better; an NVLink outweighs every PCIe sum of a
    `size`-set, so the two criteria rank lexicographically under one sum."""
    nvlink_weight = int(Distance.SYS) * size * (size - 1) // 2 + 1
    lookup = pcie if callable(pcie) else _mapping_lookup(pcie)
    n = len(ids)
    weights = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            links = nvlinks.get(frozenset((ids[i], ids[j])), 0)
            cost = int(lookup(ids[i], ids[j])) - links * nvlink_weight
            weights[i][j] = weights[j][i] = cost
    return weights


def _mapping_lookup(table: Mapping[frozenset[str], Distance]) -> Callable[[str, str], Distance]:
    def lookup(a: str, b: str) -> Distance:
        return table.get(frozenset((a, b)), Distance.SYS)

    return lookup


class _Search:
    """Branch and bound over the free GPUs, depth first in sorted ID order.

    Indices below `fixed` are the must-include GPUs, the rest the free ones in
    sorted ID order, so comparing index tuples compares sorted IDs. Bounds are kept
    doubled to stay in integers.
    """

    def __init__(self, weights: list[list[int]], fixed: int, want: int) -> None:
        self.weights = weights
        self.fixed = fixed
        self.want = want
        self.free = list(range(fixed, len(weights)))
        self.best: tuple[int, tuple[int, ...]] | None = None
        self._half_bounds = self._cheapest_partner_sums()

    def run(self) -> list[int]:
        fixed = range(self.fixed)
        base = sum(self.weights[i][j] for i in fixed for j in range(i))
        acc = [sum(row[i] for i in fixed) for row in self.weights]
        self._offer(*self._greedy(base, acc))
        self._walk(0, [], base, acc)
        assert self.best is not None
        return [*fixed, *self.best[1]]

    def _greedy(self, cost: int, acc: list[int]) -> tuple[int, tuple[int, ...]]:
        """A good first answer, so that the bound prunes from the start."""
        chosen: list[int] = []
        acc = list(acc)
        for _ in range(self.want):
            pick = min((j for j in self.free if j not in chosen), key=lambda j: acc[j])
            cost += acc[pick]
            chosen.append(pick)
            acc = [a + w for a, w in zip(acc, self.weights[pick], strict=True)]
        return self._improve(cost, acc, chosen)

    def _improve(self, cost: int, acc: list[int], chosen: list[int]) -> tuple[int, tuple[int, ...]]:
        """Swap one GPU out and another in while that lowers the cost."""
        while chosen:
            others = [j for j in self.free if j not in chosen]
            swaps = [(acc[u] - acc[c] - self.weights[c][u], c, u) for c in chosen for u in others]
            delta, out, into = min(swaps, default=(0, 0, 0))
            if delta >= 0:
                break
            cost += delta
            chosen[chosen.index(out)] = into
            acc = [
                a - w_out + w_in
                for a, w_out, w_in in zip(acc, self.weights[out], self.weights[into], strict=True)
            ]
        return cost, tuple(sorted(chosen))

    def _cheapest_partner_sums(self) -> list[list[list[int]]]:
        """[pos][j][t]: the sum of the t cheapest pairs of j with other free GPUs
        at or after position pos, the most that j's own new pairs can save."""
        table: list[list[list[int]]] = []
        for pos in range(len(self.free)):
            rest = self.free[pos:]
            # Only GPUs still ahead of the walk at pos are ever looked up.
            per_gpu: list[list[int]] = [[] for _ in range(pos + self.fixed)]
            for j in rest:
                costs = sorted(self.weights[j][k] for k in rest if k != j)
                per_gpu.append(list(accumulate(costs[: self.want], initial=0)))
            table.append(per_gpu)
        return table

    def _walk(self, pos: int, chosen: list[int], cost: int, acc: list[int]) -> None:
        left = self.want - len(chosen)
        if left == 0:
            self._offer(cost, tuple(chosen))
            return
        rest = self.free[pos:]
        if len(rest) < left or self._pruned(pos, chosen, cost, acc, left):
            return
        pick = rest[0]
        row = self.weights[pick]
        taken = [a + w for a, w in zip(acc, row, strict=True)]
        self._walk(pos + 1, [*chosen, pick], cost + acc[pick], taken)
        self._walk(pos + 1, chosen, cost, acc)

    def _pruned(self, pos: int, chosen: list[int], cost: int, acc: list[int], left: int) -> bool:
        if self.best is None:
            return False
        halves = self._half_bounds[pos]
        gains = sorted(2 * acc[j] + halves[j][left - 1] for j in self.free[pos:])
        bound = 2 * cost + sum(gains[:left])
        best_cost, best_ids = self.best
        if bound != 2 * best_cost:
            return bound > 2 * best_cost
        # An equal cost only wins with smaller IDs, which no later subset has once
        # this prefix sorts after the best one's.
        return tuple(chosen) > best_ids[: len(chosen)]

    def _offer(self, cost: int, chosen: tuple[int, ...]) -> None:
        if self.best is None or (cost, chosen) < self.best:
            self.best = (cost, chosen)


def spread_replicas(
    available_replicas: Sequence[str],
    must_include: Sequence[str],
    size: int,
    *,
    gpu_of: Callable[[str], str],
    in_use: Mapping[str, int],
) -> list[str]:
    """`size` replicas, `must_include` among them, each next one on a GPU this
    request does not use yet where possible, then on the least loaded GPU.

    `in_use` counts the replicas of each GPU held by other containers.
    """
    _check_request(available_replicas, must_include, size)
    picked = list(must_include)
    mine = Counter(gpu_of(r) for r in picked)
    # Every replica of one GPU ranks alike, so the choice is a GPU, then its lowest
    # replica number: one pass over the GPUs per pick, not over every replica.
    queues: dict[str, list[str]] = {}
    for replica in sorted(set(available_replicas) - set(picked), key=lambda r: (len(r), r)):
        queues.setdefault(gpu_of(replica), []).append(replica)
    for queue in queues.values():
        queue.reverse()  # pop() takes the lowest number

    def rank(gpu: str) -> tuple[int, int, str]:
        return (mine[gpu], in_use.get(gpu, 0) + mine[gpu], gpu)

    while len(picked) < size:
        gpu = min(queues, key=rank)
        picked.append(queues[gpu].pop())
        if not queues[gpu]:
            del queues[gpu]
        mine[gpu] += 1
    return picked
