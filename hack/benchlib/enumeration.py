"""The plain alternative to the pairing branch and bound, for measurement: every way to
take `want` devices from the classes of alike devices (same partners, same costs), each
scored whole, the best kept. The bench times it on the same states and checks that it
answers as `agents.core.pairing.prefer` does."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from agents.core.pair_score import Context, Kind, Scoring, State
from agents.core.pairing import PairView, frame
from agents.core.subsets import PairCosts


@dataclass(frozen=True)
class Enumerated:
    answer: list[str] | None  # None: more ways than the limit, not enumerated
    ways: int  # count vectors over the classes
    seconds: float


def ways(caps: Sequence[int], want: int) -> int:
    """How many count vectors over classes of `caps` devices sum to `want`."""
    table = [1] + [0] * want
    for cap in caps:
        table = [sum(table[n - t] for t in range(min(cap, n) + 1)) for n in range(want + 1)]
    return table[want]


def enumerate_prefer(
    available: Sequence[str],
    must: Sequence[str],
    size: int,
    view: PairView,
    costs: PairCosts,
    *,
    limit: int,
) -> Enumerated:
    """`prefer`'s answer by enumeration, if there are at most `limit` ways to try."""
    started = time.thread_time()
    ask = frame(available, must, size, view)
    if isinstance(ask, list):
        return Enumerated(ask, 1, 0.0)
    fixed, want, context = ask.fixed, ask.want, ask.context
    by_class: dict[tuple[Kind, int], list[str]] = {}
    for d in ask.pool:
        by_class.setdefault((ask.kind(d), costs.twin(d)), []).append(d)
    kinds = [kind for kind, _ in by_class]
    classes = list(by_class.values())
    caps = [len(c) for c in classes]
    count = ways(caps, want)
    if count > limit:
        return Enumerated(None, count, time.thread_time() - started)
    walk = _Walk(classes, kinds, fixed, want=want, costs=costs, context=context)
    answer = walk.best()
    return Enumerated(sorted([*fixed, *answer]), count, time.thread_time() - started)


class _Walk:
    """Every count vector, depth first, the score state and the pair cost carried along."""

    def __init__(
        self,
        classes: list[list[str]],
        kinds: list[Kind],
        fixed: list[str],
        *,
        want: int,
        costs: PairCosts,
        context: Context,
    ) -> None:
        self.classes = classes
        self.scoring = Scoring(kinds, [len(c) for c in classes], context)
        self.want = want
        heads = [costs.index[c[0]] for c in classes]
        self.w = [[costs.rows[a][b] for b in heads] for a in heads]
        self.inner = [costs.cost(c[0], c[1]) if len(c) > 1 else 0 for c in classes]
        fixed_ix = [costs.index[d] for d in fixed]
        self.acc0 = [sum(costs.rows[f][h] for f in fixed_ix) for h in heads]
        self.room = [sum(len(c) for c in classes[i:]) for i in range(len(classes) + 1)]
        self.head: tuple[tuple[int, ...], int] | None = None
        self.ids: list[str] = []
        self.counts: list[int] = []

    def best(self) -> list[str]:
        self._walk(self.want, 0, list(self.acc0), [], self.scoring.start)
        return self.ids

    def _walk(self, left: int, cost: int, acc: list[int], counts: list[int], state: State) -> None:
        i = len(counts)
        if left == 0:
            head = (self.scoring.value(state), cost)
            if self.head is None or head <= self.head:
                ids = sorted(d for c, n in zip(self.classes, counts, strict=False) for d in c[:n])
                if self.head is None or head < self.head or ids < self.ids:
                    self.head, self.ids, self.counts = head, ids, list(counts)
            return
        if i == len(self.classes) or self.room[i] < left:
            return
        for take in range(min(len(self.classes[i]), left), -1, -1):
            if take == 0:
                self._walk(left, cost, acc, [*counts, 0], state)
                continue
            nxt = list(acc)
            for j in range(i + 1, len(acc)):
                nxt[j] += take * self.w[i][j]
            spent = cost + take * acc[i] + take * (take - 1) // 2 * self.inner[i]
            step = self.scoring.step(state, i, take)
            self._walk(left - take, spent, nxt, [*counts, take], step)
