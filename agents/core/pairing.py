"""GPU<->NIC pairing for one resource of a container, whichever resource comes first.

Both kinds are handled alike: "this" kind is being chosen, "other" is the partner kind.
A device's partners are the other-kind devices at its smallest PCIe distance.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from agents.core.gpu_choice import cheapest_subset

# Pair costs of more candidate sets than this are not summed one by one (keeps p99 < 2 ms).
EXACT_LIMIT = 200
# Beyond this many ways to split a request over the partner classes, choose greedily.
SPLIT_LIMIT = 3000
PairCost = Callable[[str, str], int]  # lower is better; ranks sets of equal pairing score
_Class = tuple[int, bool]  # (partner bitmask, free now): devices alike to the pairing score


@dataclass(frozen=True)
class PairView:
    """What is known when one resource of one container is asked for."""

    partners: Mapping[str, frozenset[str]]  # this-kind device -> nearest other-kind devices
    other_free: frozenset[str]  # other-kind devices believed free
    container_other: frozenset[str]  # other-kind devices this container already got
    this_free: frozenset[str]  # this-kind devices free now (the kubelet's available list)


class _Scorer:
    """The pairing score of a choice from how many devices of each class it takes.

    Other-kind devices are bits; a device's class is its partner mask and whether it is
    free, which is all the score looks at, so devices of one class are interchangeable.
    """

    def __init__(self, view: PairView) -> None:
        others = sorted(frozenset().union(*view.partners.values(), view.other_free))
        bit = {o: 1 << i for i, o in enumerate(others)}
        self._bit = bit
        self.partner_mask = {d: self.mask(p) for d, p in view.partners.items()}
        self.other_free = self.mask(view.other_free)
        self.container = self.mask(view.container_other)
        self.free_masks = Counter(self.partner_mask.get(d, 0) for d in view.this_free)
        self.this_free = view.this_free

    def mask(self, ids: frozenset[str]) -> int:
        m = 0
        for i in ids:
            m |= self._bit.get(i, 0)
        return m

    def of(self, device: str) -> _Class:
        return (self.partner_mask.get(device, 0), device in self.this_free)

    def score(self, taken: Sequence[tuple[_Class, int]]) -> tuple[int, ...]:
        """Lower is better: pairing with the container first, then keeping pairs whole."""
        touched = 0
        for (m, _), _ in taken:
            touched |= m
        if self.container:
            paired = sum(c for (m, _), c in taken if m & self.container)
            head: tuple[int, ...] = (-paired, -(self.container & touched).bit_count())
        else:
            paired = groups = reach = 0
            seen: set[int] = set()
            for (m, _), c in taken:
                f = m & self.other_free
                if f:
                    paired += c
                    reach |= f
                    if f not in seen:
                        seen.add(f)
                        groups += 1
            head = (-paired, groups, -reach.bit_count())
        # Free devices outside the choice that share partners with it: pairs broken up.
        near = sum(c for m, c in self.free_masks.items() if m & touched)
        mine = sum(c for (m, free), c in taken if free and m & touched)
        return (*head, near - mine)


def score(chosen: tuple[str, ...], view: PairView) -> tuple[int, ...]:
    """Lower is better: pairing with the container first, then keeping pairs whole."""
    scorer = _Scorer(view)
    return scorer.score(list(Counter(scorer.of(d) for d in chosen).items()))


def prefer(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    view: PairView,
    pair_cost: PairCost | None = None,
) -> list[str]:
    """The `size` devices that pair best; among those, the smallest sum of `pair_cost`
    over their pairs, then the smallest sorted IDs."""
    fixed = sorted(must_include)
    need = size - len(fixed)
    if need <= 0:
        return fixed
    scorer = _Scorer(view)
    classes: dict[_Class, list[str]] = {}
    for d in sorted(set(available) - set(fixed)):
        classes.setdefault(scorer.of(d), []).append(d)
    keys = sorted(classes)
    base = Counter(scorer.of(d) for d in fixed)
    splits = _best_splits(scorer, base, [(k, len(classes[k])) for k in keys], need)
    if splits is None:
        return _greedy(
            fixed, classes=classes, need=need, scorer=scorer, base=base, pair_cost=pair_cost
        )
    cost = pair_cost or _no_cost
    used = [j for j in range(len(keys)) if any(split[j] for split in splits)]
    if len(splits) > 1 and len(splits) == _count_splits(
        [len(classes[keys[j]]) for j in used], need
    ):
        # Every way to split the request over these classes ties: any set from them will do.
        pool = [d for j in used for d in classes[keys[j]]]
        return sorted(cheapest_subset(fixed, pool, need, cost)[1])
    picks = [
        _cheapest(fixed, [(classes[k], c) for k, c in zip(keys, split, strict=True)], cost)
        for split in splits
    ]
    return min(picks)[1]


def _count_splits(caps: list[int], need: int) -> int:
    """How many ways there are to take `need` devices from classes of these sizes."""
    ways = [1] + [0] * need
    for cap in caps:
        ways = [sum(ways[n - c] for c in range(min(cap, n) + 1)) for n in range(need + 1)]
    return ways[need]


def _best_splits(
    scorer: _Scorer, base: Counter[_Class], caps: list[tuple[_Class, int]], need: int
) -> list[tuple[int, ...]] | None:
    """The ways to take `need` devices from the classes that score best; None if there
    are more than SPLIT_LIMIT ways to try.

    Depth first over the classes with the score's sums carried along (what
    `_Scorer.score` computes at once), so that each way costs a few operations.
    """
    best: tuple[int, ...] | None = None
    found: list[tuple[int, ...]] = []
    tried = 0
    room = [sum(c for _, c in caps[i:]) for i in range(len(caps) + 1)]
    cont, ofree = scorer.container, scorer.other_free
    start = _State()
    for key, c in base.items():
        start = start.add(key, c, cont, ofree)
    stack: list[tuple[int, int, tuple[int, ...], _State]] = [(0, need, (), start)]
    while stack:
        i, left, split, state = stack.pop()
        if i == len(caps):
            tried += 1
            if tried > SPLIT_LIMIT:
                return None
            s = state.score(scorer)
            if best is None or s < best:
                best, found = s, [split]
            elif s == best:
                found.append(split)
            continue
        key, cap = caps[i]
        for c in range(max(0, left - room[i + 1]), min(cap, left) + 1):
            nxt = state.add(key, c, cont, ofree) if c else state
            stack.append((i + 1, left - c, (*split, c), nxt))
    return found


class _State(NamedTuple):
    """The score's sums over the classes taken so far."""

    touched: int = 0
    paired: int = 0  # with a partner in the container, or else with a free partner
    reach: int = 0
    groups: frozenset[int] = frozenset()
    mine: int = 0  # free devices taken that have partners

    def add(self, key: _Class, c: int, cont: int, ofree: int) -> _State:
        m, free = key
        f = m & ofree
        hit = m & cont if cont else f
        return _State(
            self.touched | m,
            self.paired + c if hit else self.paired,
            self.reach | f,
            self.groups | {f} if f and not cont else self.groups,
            self.mine + c if free and m else self.mine,
        )

    def score(self, scorer: _Scorer) -> tuple[int, ...]:
        t = self.touched
        near = sum(c for m, c in scorer.free_masks.items() if m & t)
        if scorer.container:
            head: tuple[int, ...] = (-self.paired, -(scorer.container & t).bit_count())
        else:
            head = (-self.paired, len(self.groups), -self.reach.bit_count())
        return (*head, near - self.mine)


def _no_cost(a: str, b: str) -> int:
    return 0


def _cheapest(
    fixed: list[str], parts: list[tuple[list[str], int]], cost: PairCost
) -> tuple[int, list[str]]:
    """(pair cost sum, sorted IDs) of the cheapest set taking `count` of each part."""
    forced = list(fixed)
    partial: list[tuple[list[str], int]] = []
    for ids, count in parts:
        if count == len(ids):
            forced += ids
        elif count:
            partial.append((ids, count))
    if not partial:
        return _set_cost(forced, cost), sorted(forced)
    if len(partial) == 1:
        ids, count = partial[0]
        total, chosen = cheapest_subset(forced, ids, count, cost)
        return total, sorted(chosen)
    ways = math.prod(math.comb(len(ids), c) for ids, c in partial)
    if ways > EXACT_LIMIT:
        return _greedy_parts(forced, partial, cost)
    combos = itertools.product(*(itertools.combinations(ids, c) for ids, c in partial))
    return min(
        (_set_cost(chosen, cost), sorted(chosen))
        for chosen in ([*forced, *itertools.chain.from_iterable(combo)] for combo in combos)
    )


def _set_cost(ids: Sequence[str], cost: PairCost) -> int:
    return sum(cost(a, b) for a, b in itertools.combinations(ids, 2))


def _greedy_parts(
    forced: list[str], partial: list[tuple[list[str], int]], cost: PairCost
) -> tuple[int, list[str]]:
    """One device at a time, the cheapest next to those chosen, within each part's quota."""
    chosen = list(forced)
    quota = {i: c for i, (_, c) in enumerate(partial)}
    left = [(d, i) for i, (ids, _) in enumerate(partial) for d in ids]
    while any(quota.values()):
        d, i = min(
            ((d, i) for d, i in left if quota[i]),
            key=lambda p: (sum(cost(p[0], c) for c in chosen), p[0]),
        )
        chosen.append(d)
        quota[i] -= 1
        left.remove((d, i))
    return _set_cost(chosen, cost), sorted(chosen)


def _greedy(
    fixed: list[str],
    *,
    classes: dict[_Class, list[str]],
    need: int,
    scorer: _Scorer,
    base: Counter[_Class],
    pair_cost: PairCost | None,
) -> list[str]:
    """Too many ways to split the request: add the best next device, one at a time."""
    cost = pair_cost or _no_cost
    chosen = list(fixed)
    taken = Counter(base)
    left = [(d, k) for k, ids in classes.items() for d in ids]
    for _ in range(need):
        scores = {k: scorer.score(list((taken + Counter({k: 1})).items())) for _, k in left}
        pick = min(left, key=lambda p: (scores[p[1]], sum(cost(p[0], c) for c in chosen), p[0]))
        left.remove(pick)
        chosen.append(pick[0])
        taken[pick[1]] += 1
    return sorted(chosen)
