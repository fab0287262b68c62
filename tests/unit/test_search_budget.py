"""The preferred-allocation searches under a deadline: whenever the clock runs out, a
valid choice comes back, and the deadline is read from the clock passed in."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.core.budget import CHECK_EVERY, Watch, deadline, never
from agents.core.gpu_choice import choose
from agents.core.pairing import PairView, Partners, prefer
from agents.core.subsets import PairCosts


class FakeClock:
    """Reads 0, 1, 2, ...: one tick per reading, so a deadline of N seconds expires at
    the N-th look after it was set."""

    def __init__(self) -> None:
        self.now = -1
        self.reads = 0

    def __call__(self) -> float:
        self.now += 1
        self.reads += 1
        return float(self.now)


def node(rng: random.Random, n: int, width: int) -> tuple[list[str], Partners, PairCosts]:
    """n devices with irregular pair costs and partners among `width` others, shared
    unevenly: the searches have real work on it."""
    ids = [f"d{i:02d}" for i in range(n)]
    others = [f"o{i}" for i in range(width)]
    partners = Partners({d: frozenset(rng.sample(others, rng.randint(1, 2))) for d in ids})
    costs = PairCosts.of(ids, lambda a, b: rng.randint(-3, 5))
    return ids, partners, costs


def request(rng: random.Random, ids: list[str]) -> tuple[list[str], list[str], int]:
    available = rng.sample(ids, rng.randint(len(ids) // 2, len(ids)))
    size = rng.randint(1, len(available))
    must = rng.sample(available, rng.randint(0, min(2, size)))
    return available, must, size


def assert_valid(got: list[str], available: list[str], must: list[str], size: int) -> None:
    assert len(got) == size
    assert len(set(got)) == size
    assert set(must) <= set(got) <= set(available)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000), ticks=st.integers(0, 6 * CHECK_EVERY))
def test_prefer_answers_a_valid_choice_whenever_the_deadline_passes(seed: int, ticks: int) -> None:
    rng = random.Random(seed)
    ids, partners, costs = node(rng, 20, 6)
    available, must, size = request(rng, ids)
    others = sorted(frozenset().union(*partners.values()))
    view = PairView(
        partners=partners,
        other_free=frozenset(rng.sample(others, rng.randint(0, len(others)))),
        container_other=frozenset(rng.sample(others, rng.randint(0, 2))),
        this_free=frozenset(available) - frozenset(must),
    )
    clock = FakeClock()
    got = prefer(available, must, size, view, costs, expired=deadline(clock, ticks))
    assert_valid(got, available, must, size)


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10_000), ticks=st.integers(0, 6 * CHECK_EVERY))
def test_choose_answers_a_valid_choice_whenever_the_deadline_passes(seed: int, ticks: int) -> None:
    rng = random.Random(seed)
    ids, _, costs = node(rng, 24, 2)
    available, must, size = request(rng, ids)
    got = choose(available, must, size, costs, expired=deadline(FakeClock(), ticks))
    assert_valid(got, available, must, size)


def _cost(chosen: list[str], costs: PairCosts) -> int:
    return sum(costs.cost(a, b) for a, b in itertools.combinations(chosen, 2))


def test_an_expired_deadline_stops_the_search_and_keeps_its_first_choice() -> None:
    rng = random.Random(7)
    ids, _, costs = node(rng, 28, 2)
    clock = FakeClock()
    at_once = choose(ids, [], 12, costs, expired=deadline(clock, 0))
    best = choose(ids, [], 12, costs)
    assert_valid(at_once, ids, [], 12)
    # One reading to set the deadline, one to find it passed: nothing more was searched.
    assert clock.reads == 2
    assert _cost(best, costs) <= _cost(at_once, costs)


def test_a_deadline_that_never_comes_gives_the_unbounded_optimum() -> None:
    rng = random.Random(11)
    for _ in range(30):
        ids, _, costs = node(rng, 12, 2)
        available, must, size = request(rng, ids)
        far = deadline(FakeClock(), 10**9)
        assert choose(available, must, size, costs, expired=far) == choose(
            available, must, size, costs
        )


@pytest.mark.parametrize("after", [1, 2, 5], ids=["first-look", "second-look", "fifth-look"])
def test_watch_looks_every_few_steps_and_stays_stopped(after: int) -> None:
    looks = []

    def expired() -> bool:
        looks.append(True)
        return len(looks) >= after

    watch = Watch(expired)
    steps = 0
    while not watch.step():
        steps += 1
    assert steps == (after - 1) * CHECK_EVERY
    assert all(watch.step() for _ in range(3 * CHECK_EVERY))
    assert len(looks) == after


def test_never_never_expires() -> None:
    watch = Watch(never)
    assert not any(watch.step() for _ in range(10 * CHECK_EVERY))
