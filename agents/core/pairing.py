"""GPU<->NIC pairing for one resource of a container, whichever resource comes first.

Both kinds are handled alike: "this" kind is being chosen, "other" is the partner kind.
A device's partners are the other-kind devices at its smallest PCIe distance.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from agents.core.budget import Expired, Watch, never
from agents.core.pair_score import Context, Kind, Score, Scoring, State, signatures
from agents.core.subsets import PairCosts, Search, cheapest


class Partners(Mapping[str, frozenset[str]]):
    """Each device's partners, also as bitmasks over the other kind; built once per
    resource, as the topology does not change."""

    def __init__(self, partners: Mapping[str, frozenset[str]]) -> None:
        self._sets = dict(partners)
        others = sorted(frozenset().union(*self._sets.values()))
        self._bit = {o: 1 << n for n, o in enumerate(others)}
        self.masks = {d: self.mask(p) for d, p in self._sets.items()}

    def mask(self, others: Iterable[str]) -> int:
        """The bits of those of `others` that are someone's partners."""
        m = 0
        for o in others:
            m |= self._bit.get(o, 0)
        return m

    def __getitem__(self, device: str) -> frozenset[str]:
        return self._sets[device]

    def __iter__(self) -> Iterator[str]:
        return iter(self._sets)

    def __len__(self) -> int:
        return len(self._sets)


@dataclass(frozen=True)
class PairView:
    """What is known when one resource of one container is asked for."""

    partners: Mapping[str, frozenset[str]]  # this-kind device -> nearest other-kind devices
    other_free: frozenset[str]  # other-kind devices believed free
    container_other: frozenset[str]  # other-kind devices this container already got
    this_free: frozenset[str]  # this-kind devices free now (the kubelet's available list)


def paired(
    chosen: Iterable[str], partners: Mapping[str, frozenset[str]], free: frozenset[str]
) -> int:
    """How many of `chosen` have a partner among `free`."""
    return sum(1 for d in chosen if partners.get(d, frozenset()) & free)


def score(chosen: Sequence[str], view: PairView) -> Score:
    """Lower is better: pairing with the container first, then keeping pairs whole.

    The definition, one set at a time; `prefer` finds the best set without scoring each.
    """
    partners = [view.partners.get(d, frozenset()) for d in chosen]
    if view.container_other:
        paired = sum(1 for p in partners if p & view.container_other)
        covered = sum(1 for o in view.container_other if any(o in p for p in partners))
        head: tuple[int, ...] = (-paired, -covered)
    else:
        with_free = [p & view.other_free for p in partners]
        paired = sum(1 for p in with_free if p)
        groups = len({p for p in with_free if p})
        # More free partners in all leaves the other resource more ways to pair.
        reach = len(frozenset().union(*with_free)) if with_free else 0
        head = (-paired, groups, -reach)
    # Free devices outside the choice that share partners with it: pairs broken up.
    touched = frozenset().union(*partners) if partners else frozenset()
    left = sum(
        1 for d in view.this_free if d not in chosen and view.partners.get(d, frozenset()) & touched
    )
    return (*head, left)


def prefer(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    view: PairView,
    costs: PairCosts | None = None,
    *,
    expired: Expired = never,
) -> list[str]:
    """The `size` devices with the best `score`; among those, the smallest sum of pair
    `costs` (which covers every available device), then the smallest sorted IDs.
    Once `expired`, the searches stop and the best choice found so far is returned."""
    ask = frame(available, must_include, size, view)
    if isinstance(ask, list):
        return ask
    fixed, pool, want, context = ask.fixed, ask.pool, ask.want, ask.context
    by_kind: dict[Kind, list[str]] = {}
    for d in pool:
        by_kind.setdefault(ask.kind(d), []).append(d)
    costs = costs or PairCosts.free(pool + fixed)
    alike = _search_order(by_kind, fixed, costs, context)
    return sorted([*fixed, *_choose(alike, fixed, want, costs, context, expired=expired)])


@dataclass(frozen=True)
class Frame:
    """One preferred-allocation request laid out for a search: the devices it must
    include, those it may add, how many, and the score's context."""

    fixed: list[str]
    pool: list[str]
    want: int
    context: Context
    masks: Mapping[str, int]
    free: frozenset[str]

    def kind(self, device: str) -> Kind:
        """What the score sees of a device: its partners and whether it is free."""
        return (self.masks.get(device, 0), device in self.free)


def frame(
    available: Sequence[str], must_include: Sequence[str], size: int, view: PairView
) -> Frame | list[str]:
    """The request as a Frame, or its answer where there is nothing to choose."""
    fixed = sorted(must_include)
    pool = sorted(set(available) - set(fixed))
    want = size - len(fixed)
    if want <= 0 or want >= len(pool):
        return sorted([*fixed, *pool[: max(want, 0)]])
    partners = view.partners if isinstance(view.partners, Partners) else Partners(view.partners)
    masks, free = partners.masks, view.this_free
    context = Context(
        fixed=tuple((masks.get(d, 0), d in free) for d in fixed),
        container=partners.mask(view.container_other) if view.container_other else None,
        other_free=partners.mask(view.other_free),
        free_masks=Counter(masks.get(d, 0) for d in free),
    )
    return Frame(fixed, pool, want, context, masks, free)


def _choose(
    alike: dict[Kind, list[str]],
    fixed: list[str],
    want: int,
    costs: PairCosts,
    context: Context,
    *,
    expired: Expired,
) -> list[str]:
    """Two searches: the best score over the classes of devices alike to it, then the
    cheapest set with that score over classes alike to both the score and the costs.
    Where the bounds prove that every choice left scores the same, costs alone decide."""
    coarse = Scoring(list(alike), [len(c) for c in alike.values()], context)
    if coarse.settled(coarse.start, 0, want) is not None:
        return cheapest(fixed, [d for c in alike.values() for d in c], want, costs, expired=expired)
    best = best_score(coarse, want, expired=expired)
    finer: dict[tuple[Kind, int], list[str]] = {}
    for n, (kind, devices) in enumerate(alike.items()):
        if best.usable is None or n in best.usable:
            for d in devices:
                finer.setdefault((kind, costs.twin(d)), []).append(d)
    fine = sorted(((kind, devices) for (kind, _), devices in finer.items()), key=lambda f: f[1][0])
    classes = [devices for _, devices in fine]
    scoring = Scoring([kind for kind, _ in fine], [len(c) for c in classes], context)
    if scoring.settled(scoring.start, 0, want) is not None:
        return cheapest(fixed, [d for c in classes for d in c], want, costs, expired=expired)
    # One set with the best score, to start the second search with a bound (and to stand
    # if the deadline leaves it no time): within each class, the cheapest devices.
    picked = _cheap_pick(list(alike.values()), best.counts, fixed, costs)
    search = _ScoreFilter(
        fixed, classes, want, costs, scoring=scoring, target=best.score, expired=expired
    )
    chosen = search.run([sum(d in picked for d in c) for c in classes])
    assert chosen is not None  # the first search found a set with the target score
    return chosen


def _cheap_pick(
    classes: list[list[str]], counts: list[int], fixed: list[str], costs: PairCosts
) -> set[str]:
    """`counts[i]` devices of each class i, one at a time: the device cheapest next to
    `fixed` and those taken so far (the smallest ID on ties). Any choice of the same
    counts scores the same; this one is a cheap one."""
    need = {i: n for i, n in enumerate(counts) if n}
    acc = {(d, i): sum(costs.cost(d, f) for f in fixed) for i in need for d in classes[i]}
    picked: set[str] = set()
    while acc:
        device, i = min(acc, key=lambda key: (acc[key], key[0]))
        picked.add(device)
        del acc[(device, i)]
        need[i] -= 1
        if not need[i]:
            acc = {key: value for key, value in acc.items() if key[1] != i}
        for key in acc:
            acc[key] += costs.cost(key[0], device)
    return picked


def _search_order(
    by_kind: dict[Kind, list[str]], fixed: list[str], costs: PairCosts, context: Context
) -> dict[Kind, list[str]]:
    """Pairing classes first, the largest first: good scores found early cut the search
    most. Then those cheapest next to the fixed devices, twins together: the set found
    first is then a cheap one, a tight bound for the second search."""
    pairs = context.other_free if context.container is None else context.container
    near_fixed: dict[int, int] = {}
    for devices in by_kind.values():
        twin = costs.twin(devices[0])
        if twin not in near_fixed:
            near_fixed[twin] = sum(costs.cost(devices[0], f) for f in fixed)

    kinds = list(by_kind)
    sigs = signatures(kinds, [len(by_kind[k]) for k in kinds], context, pairs)
    alike = {k: (1, ()) if sig is None else (0, sig) for k, sig in zip(kinds, sigs, strict=True)}

    def rank(
        item: tuple[Kind, list[str]],
    ) -> tuple[bool, int, tuple[int, tuple[int, ...]], int, int]:
        kind, devices = item
        twin = costs.twin(devices[0])
        return (not kind[0] & pairs, -len(devices), alike[kind], near_fixed[twin], twin)

    return dict(sorted(by_kind.items(), key=rank))


class _ScoreFilter(Search[State]):
    """The cheapest set among those whose score is `target` (the best there is): a
    branch is cut as soon as one score component can no longer come out equal."""

    def __init__(
        self,
        fixed: Sequence[str],
        classes: Sequence[Sequence[str]],
        want: int,
        costs: PairCosts,
        *,
        scoring: Scoring,
        target: Score,
        expired: Expired,
    ) -> None:
        super().__init__(fixed, classes, want, costs, scoring.start, expired=expired)
        self.scoring, self.target = scoring, target

    def step(self, state: State, i: int, take: int) -> State:
        return self.scoring.step(state, i, take)

    def feasible(self, state: State, i: int, left: int) -> bool:
        return self.scoring.can_reach(state, i, left, self.target)

    def accept(self, state: State) -> bool:
        return self.scoring.value(state) == self.target


class Best(NamedTuple):
    score: Score
    counts: list[int]  # one choice with that score
    usable: set[int] | None  # classes some choice with that score draws on; None: any may


def best_score(scoring: Scoring, want: int, budget: int = 400, expired: Expired = never) -> Best:
    """The lowest score of `want` devices from the classes, one choice that has it, and
    which classes the choices that have it draw on.

    Depth first, the most of each class first. A branch whose bounds cannot reach the
    best so far is cut; a branch whose bounds leave a single score is counted whole.
    Of classes that `scoring` finds interchangeable, a choice takes no more from one
    than from the one before it: any other choice scores as one of those does.
    Past `budget` branches, ties are cut too and every class counts as usable; once
    `expired`, the best found so far stands (the first choice tried, if none yet).
    """
    k = len(scoring.caps)
    best: Best | None = None
    stack: list[tuple[int, int, State, list[int]]] = [(0, want, scoring.start, [])]
    watch = Watch(expired)
    while stack and not watch.step():
        i, left, state, counts = stack.pop()
        if left == 0:
            best = _better(best, scoring.value(state), counts + [0] * (k - i), k)
            continue
        if scoring.room[i] < left:
            continue
        cut, lows = _judge(scoring.spans(state, i, left), best, watch.steps > budget)
        if cut:
            continue
        if lows is not None:
            # Every way on from here scores `lows`: one of them stands for all.
            best = _better(best, tuple(lows), counts + _fill(scoring, i, left), k, range(i, k))
            continue
        low = max(0, left - scoring.room[i + 1])
        high = min(scoring.caps[i], left, counts[-1] if scoring.same_as_previous[i] else left)
        # Pushed smallest first, so the most of class i is tried first.
        for take in range(low, high + 1):
            nxt = scoring.step(state, i, take) if take else state
            stack.append((i + 1, left - take, nxt, [*counts, take]))
    if best is None:
        counts = _fill(scoring, 0, want)
        state = scoring.start
        for i, take in enumerate(counts):
            state = scoring.step(state, i, take) if take else state
        return Best(scoring.value(state), counts, None)
    if watch.stopped or watch.steps > budget or best.usable is None:
        return best._replace(usable=None)
    return best._replace(usable=scoring.with_interchangeable(best.usable))


def _fill(scoring: Scoring, i: int, left: int) -> list[int]:
    """The most of each class from i on, in order, until `left` are taken."""
    rest = []
    for cap in scoring.caps[i:]:
        rest.append(min(cap, left))
        left -= rest[-1]
    return rest


def _judge(
    spans: Iterator[tuple[int, int]], best: Best | None, over_budget: bool
) -> tuple[bool, list[int] | None]:
    """Whether to cut a branch (it cannot reach `best`; or only tie it, `over_budget`),
    and the one score all its ways have, if the bounds prove there is one. Stops
    reading the bounds as soon as neither can follow."""
    tied, flat, lows = best is not None, True, []
    for n, (lo, hi) in enumerate(spans):
        if tied and best is not None:
            if lo > best.score[n]:
                return True, None
            tied = lo == best.score[n]
        flat = flat and lo == hi
        if not (tied or flat):
            return False, None
        lows.append(lo)
    return tied and over_budget, lows if flat else None


def _better(
    best: Best | None, score: Score, counts: list[int], k: int, ahead: range = range(0)
) -> Best:
    """`best` updated with a choice (`counts`) and, if `ahead`, all ways that vary the
    counts of those classes; they all score `score`."""
    used = {j for j in range(k) if counts[j]} | set(ahead)
    if best is None or score < best.score:
        return Best(score, counts, used)
    if score == best.score and best.usable is not None:
        best.usable.update(used)
    return best
