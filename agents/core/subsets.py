"""The cheapest k devices under a pair cost, by branch and bound over classes of
interchangeable devices; the GPU choice and the pairing tie-break both use it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Generic, TypeVar

from agents.core.budget import Expired, Watch, never

State = TypeVar("State")


@dataclass(frozen=True)
class PairCosts:
    """Pair costs among a fixed set of devices, lower is better; built once per resource.

    Twins (devices with the same cost to every other device) are interchangeable in any
    choice, so a search only decides how many of each twin class it takes.
    """

    index: Mapping[str, int]
    rows: tuple[tuple[int, ...], ...]
    twins: tuple[int, ...]  # twin class of each index

    @classmethod
    def of(cls, ids: Sequence[str], cost: Callable[[str, str], int]) -> PairCosts:
        """Costs of every pair of `ids`; `cost` is asked once per pair, in sorted order."""
        order = sorted(set(ids))
        n = len(order)
        rows = [[0] * n for _ in range(n)]
        for i in range(n):
            for j in range(i + 1, n):
                rows[i][j] = rows[j][i] = cost(order[i], order[j])
        return cls({d: i for i, d in enumerate(order)}, tuple(map(tuple, rows)), _twins(rows))

    @classmethod
    def free(cls, ids: Sequence[str]) -> PairCosts:
        """Every pair costs the same: only the other criteria and the IDs decide."""
        return cls.of(ids, lambda a, b: 0)

    def cost(self, a: str, b: str) -> int:
        return self.rows[self.index[a]][self.index[b]]

    def twin(self, device: str) -> int:
        return self.twins[self.index[device]]


def _twins(rows: list[list[int]]) -> tuple[int, ...]:
    """Twin class per index. Being twins is transitive: if a, b and b, c are twins, the
    costs a-b, a-c and b-c are equal, so a single representative per class is enough."""
    reps: list[int] = []
    twins: list[int] = []
    for i, row in enumerate(rows):
        for t, r in enumerate(reps):
            mine, theirs = list(row), list(rows[r])
            mine[i] = mine[r] = theirs[i] = theirs[r] = 0
            if mine == theirs:
                twins.append(t)
                break
        else:
            twins.append(len(reps))
            reps.append(i)
    return tuple(twins)


def twin_classes(devices: Iterable[str], costs: PairCosts) -> list[list[str]]:
    """The devices by twin class, each sorted, in the order of their smallest IDs."""
    by_twin: dict[int, list[str]] = {}
    for device in sorted(devices):
        by_twin.setdefault(costs.twin(device), []).append(device)
    return list(by_twin.values())


def cheapest(
    fixed: Sequence[str],
    devices: Iterable[str],
    want: int,
    costs: PairCosts,
    *,
    expired: Expired = never,
) -> list[str]:
    """`want` of `devices` with the smallest sum of pair costs, `fixed` counted in, then
    the smallest sorted IDs; sorted, without `fixed`. Once `expired`, the best found."""
    classes = twin_classes(devices, costs)
    search: Search[None] = Search(fixed, classes, want, costs, None, expired=expired)
    chosen = search.run(search.greedy())
    assert chosen is not None
    return chosen


class Search(Generic[State]):
    """Depth first over the classes in the given order, taking the most of each first.

    Each class is a sorted list of interchangeable devices (same pair costs, same score
    for a caller's filter), so a choice is how many of each it takes, and taking its
    smallest IDs breaks every tie within it. The key of a choice is (pair cost sum,
    sorted IDs). A subclass may carry a state along (`step`) and reject choices
    (`feasible` on a partial one, `accept` on a whole one). Once `expired`, the walk
    stops and the best choice offered so far stands (the incumbent given to `run`).
    """

    def __init__(
        self,
        fixed: Sequence[str],
        classes: Sequence[Sequence[str]],
        want: int,
        costs: PairCosts,
        start: State,
        *,
        expired: Expired = never,
    ) -> None:
        self.fixed = list(fixed)
        self.classes = [list(c) for c in classes]
        self.want = want
        self.start = start
        k = len(classes)
        self.caps = [len(c) for c in classes]
        self.room = list(accumulate(reversed(self.caps), initial=0))[::-1]
        heads = [costs.index[c[0]] for c in classes]
        rows = costs.rows
        self.w = [[rows[a][b] for b in heads] for a in heads]
        self.inner = [
            rows[costs.index[c[0]]][costs.index[c[1]]] if len(c) > 1 else 0 for c in classes
        ]
        fixed_ix = [costs.index[d] for d in fixed]
        self.base = sum(rows[a][b] for n, a in enumerate(fixed_ix) for b in fixed_ix[:n])
        self.acc0 = [sum(rows[f][h] for f in fixed_ix) for h in heads]
        self._halves: list[list[list[int]] | None] = [None] * k
        # Where every device of the classes before i sorts before those from i on, the
        # IDs taken so far are the head of any final choice's sorted IDs.
        low = list(accumulate((c[-1] for c in self.classes), max, initial=""))
        high = list(accumulate((c[0] for c in reversed(self.classes)), min))[::-1]
        self.prefix_ok = [i == 0 or low[i] < high[i] for i in range(k)] + [True]
        self.best: tuple[int, list[str]] | None = None
        self.watch = Watch(expired)

    def step(self, state: State, i: int, take: int) -> State:
        """The state after taking `take` devices of class i (take > 0)."""
        return state

    def feasible(self, state: State, i: int, left: int) -> bool:
        """False if no way to take `left` more from classes i.. can be accepted."""
        return True

    def accept(self, state: State) -> bool:
        return True

    def run(self, incumbent: Sequence[int] | None = None) -> list[str] | None:
        """The best accepted choice, sorted; None if none is accepted."""
        if incumbent is not None:
            state = self.start
            for i, take in enumerate(incumbent):
                if take:
                    state = self.step(state, i, take)
            if self.accept(state):
                self._offer(self._cost(incumbent), list(incumbent))
        self._walk(self.want, self.base, list(self.acc0), [], self.start)
        return None if self.best is None else self.best[1]

    def greedy(self) -> list[int]:
        """A good first choice, so that the bound prunes from the start: one device at a
        time, the one cheapest next to those taken (the filter is not asked)."""
        counts = [0] * len(self.caps)
        acc = list(self.acc0)
        for _ in range(self.want):
            pick = min(
                (j for j in range(len(acc)) if counts[j] < self.caps[j]), key=acc.__getitem__
            )
            counts[pick] += 1
            for j, w in enumerate(self.w[pick]):
                acc[j] += w if j != pick else self.inner[pick]
        return counts

    def _cost(self, counts: Sequence[int]) -> int:
        total, acc = self.base, list(self.acc0)
        for i, take in enumerate(counts):
            total += take * acc[i] + take * (take - 1) // 2 * self.inner[i]
            for j in range(i + 1, len(acc)):
                acc[j] += take * self.w[i][j]
        return total

    def _ids(self, counts: Sequence[int]) -> list[str]:
        return sorted(d for c, take in zip(self.classes, counts, strict=False) for d in c[:take])

    def _offer(self, cost: int, counts: list[int]) -> None:
        if self.best is None or cost < self.best[0]:
            self.best = (cost, self._ids(counts))
        elif cost == self.best[0]:
            ids = self._ids(counts)
            if ids < self.best[1]:
                self.best = (cost, ids)

    def _walk(self, left: int, cost: int, acc: list[int], counts: list[int], state: State) -> None:
        """Classes before len(counts) are decided; `acc` holds each class's cost to the
        devices taken so far, `left` how many more to take."""
        if self.watch.step():
            return
        i = len(counts)
        if left == 0:
            if self.accept(state):
                self._offer(cost, counts)
            return
        if self.room[i] < left:
            return
        if i == len(acc) - 1:  # the last class: the rest is forced
            spent = cost + left * acc[i] + left * (left - 1) // 2 * self.inner[i]
            self._walk(0, spent, acc, [*counts, left], self.step(state, i, left))
            return
        if not self.feasible(state, i, left) or self._bounded(i, left, cost, acc, counts):
            return
        if left == 1:
            self._last(i, cost, acc, counts, state)
            return
        w_i, cap = self.w[i], self.caps[i]
        for take in range(min(cap, left), max(0, left - self.room[i + 1]) - 1, -1):
            if take == 0:
                self._walk(left, cost, acc, [*counts, 0], state)
                continue
            nxt = list(acc)
            for j in range(i + 1, len(acc)):
                nxt[j] += take * w_i[j]
            spent = cost + take * acc[i] + take * (take - 1) // 2 * self.inner[i]
            self._walk(left - take, spent, nxt, [*counts, take], self.step(state, i, take))

    def _last(self, i: int, cost: int, acc: list[int], counts: list[int], state: State) -> None:
        """One device left to take: the cheapest accepted class, smallest ID on ties."""
        for _, _, j in sorted((acc[j], self.classes[j][0], j) for j in range(i, len(acc))):
            if self.accept(self.step(state, j, 1)):
                pad = [0] * (j - i)
                self._offer(cost + acc[j], [*counts, *pad, 1])
                return

    def _bounded(self, i: int, left: int, cost: int, acc: list[int], counts: list[int]) -> bool:
        """Whether no completion can beat the best so far (bounds doubled: integers)."""
        if self.best is None:
            return False
        half, halves = left - 1, self._cheapest_partner_sums(i)
        slots = sorted((2 * acc[j] + halves[j][half], self.caps[j]) for j in range(i, len(acc)))
        bound, need = 2 * cost, left
        for value, cap in slots:
            take = min(cap, need)
            bound += take * value
            need -= take
            if not need:
                break
        best_cost, best_ids = self.best
        if bound != 2 * best_cost:
            return bound > 2 * best_cost
        if not self.prefix_ok[i]:
            return False
        # An equal cost only wins with smaller IDs, which no completion has once the IDs
        # taken so far sort after the head of the best one's.
        taken = self._ids(counts)
        return taken > best_ids[: len(taken)]

    def _cheapest_partner_sums(self, i: int) -> list[list[int]]:
        """[j][t] for classes j >= i: the sum of the t cheapest pair costs between one
        device of class j and the other devices of classes i..; halved, what its pairs
        among new picks cost at least. Built when the walk first reaches i."""
        table = self._halves[i]
        if table is None:
            table = [[] for _ in range(i)]
            for j in range(i, len(self.caps)):
                row, costs = self.w[j], []
                for k in range(i, len(self.caps)):
                    costs += [row[k] if k != j else self.inner[j]] * (self.caps[k] - (k == j))
                costs.sort()
                table.append(list(accumulate(costs[: max(self.want - 1, 0)], initial=0)))
            self._halves[i] = table
        return table
