"""Pairing: the pure choice of one resource (agents.core.pairing)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.core.pairing import PairView, prefer, score
from agents.core.subsets import PairCosts

# One switch per pair: g<i> <-> n<i> (the 8-GPU, 8-NIC shape, four of it).
ONE_TO_ONE = {f"g{i}": frozenset({f"n{i}"}) for i in range(4)}
ONE_TO_ONE_NICS = {f"n{i}": frozenset({f"g{i}"}) for i in range(4)}
# Two GPUs per switch and NIC: g0,g1 <-> n0; g2,g3 <-> n1 (the 8-GPU, 4-NIC shape, half).
TWO_TO_ONE = {f"g{i}": frozenset({f"n{i // 2}"}) for i in range(4)}
TWO_TO_ONE_NICS = {f"n{i}": frozenset({f"g{2 * i}", f"g{2 * i + 1}"}) for i in range(2)}
GPUS = sorted(ONE_TO_ONE)


def view(
    partners: Mapping[str, frozenset[str]],
    *,
    other_free: set[str],
    container_other: set[str] = frozenset(),  # type: ignore[assignment]
    this_free: set[str] | None = None,
) -> PairView:
    return PairView(
        partners=partners,
        other_free=frozenset(other_free),
        container_other=frozenset(container_other),
        this_free=frozenset(set(partners) if this_free is None else this_free),
    )


@pytest.mark.parametrize(
    ("available", "size", "pair_view", "expected"),
    [
        pytest.param(
            GPUS,
            2,
            view(ONE_TO_ONE, other_free={"n0", "n1", "n2", "n3"}, container_other={"n2", "n3"}),
            ["g2", "g3"],
            id="second-resource-takes-the-partners-of-the-first",
        ),
        pytest.param(
            ["n0", "n1", "n2", "n3"],
            1,
            view(ONE_TO_ONE_NICS, other_free={"g0", "g1", "g2", "g3"}, container_other={"g3"}),
            ["n3"],
            id="nic-second-takes-its-gpu-partner",
        ),
        pytest.param(
            GPUS,
            2,
            view(ONE_TO_ONE, other_free={"n1", "n3"}),
            ["g1", "g3"],
            id="first-prefers-devices-whose-partners-are-free",
        ),
        pytest.param(
            GPUS,
            2,
            view(TWO_TO_ONE, other_free={"n0", "n1"}),
            ["g0", "g1"],
            id="first-keeps-a-container-on-as-few-partners-as-possible",
        ),
        pytest.param(
            ["n0", "n1"],
            1,
            view(TWO_TO_ONE_NICS, other_free={"g0", "g2", "g3"}, this_free={"n0", "n1"}),
            ["n1"],
            id="nic-first-prefers-the-one-with-more-free-gpus",
        ),
        pytest.param(
            ["g0", "g2", "g3"],
            1,
            view(TWO_TO_ONE, other_free=set(), this_free={"g0", "g2", "g3"}),
            ["g0"],
            id="single-kind-leaves-a-whole-pair-behind",
        ),
        pytest.param(
            GPUS,
            4,
            view(ONE_TO_ONE, other_free=set()),
            GPUS,
            id="everything-asked-for",
        ),
        pytest.param(
            ["g0", "g1", "g2"],
            1,
            view(
                {"g0": frozenset({"n1"}), "g1": frozenset({"n3"}), "g2": frozenset({"n1", "n2"})},
                other_free={"n1", "n3"},
            ),
            ["g1"],
            id="a-switch-whose-partner-another-shares-is-not-alike-to-one-alone",
        ),
    ],
)
def test_prefer_pairs_as_the_table_says(
    available: list[str], size: int, pair_view: PairView, expected: list[str]
) -> None:
    assert prefer(available, [], size, pair_view) == expected


def test_prefer_keeps_must_include_even_when_it_pairs_badly() -> None:
    pair_view = view(ONE_TO_ONE, other_free=set(), container_other={"n3"})
    assert prefer(GPUS, ["g0"], 2, pair_view) == ["g0", "g3"]


@given(
    data=st.data(),
    n=st.integers(1, 12),
)
def test_prefer_returns_size_distinct_available_ids_including_must_include(
    data: st.DataObject, n: int
) -> None:
    ids = [f"d{i}" for i in range(n)]
    others = [f"o{i}" for i in range(4)]
    partners = {d: frozenset(data.draw(st.sets(st.sampled_from(others)))) for d in ids}
    available = data.draw(st.lists(st.sampled_from(ids), min_size=1, unique=True))
    must = data.draw(st.lists(st.sampled_from(available), unique=True))
    size = data.draw(st.integers(max(len(must), 1), len(available)))
    pair_view = PairView(
        partners=partners,
        other_free=frozenset(data.draw(st.sets(st.sampled_from(others)))),
        container_other=frozenset(data.draw(st.sets(st.sampled_from(others)))),
        this_free=frozenset(available) - frozenset(must),
    )
    chosen = prefer(available, must, size, pair_view)
    assert len(chosen) == size
    assert len(set(chosen)) == size
    assert set(chosen) <= set(available)
    assert set(must) <= set(chosen)


def _brute_force(
    available: list[str], must: list[str], size: int, pair_view: PairView, costs: PairCosts
) -> list[str]:
    """The definition `prefer` implements: pairing score, then pair cost, then sorted IDs."""
    fixed = tuple(sorted(must))
    pool = sorted(set(available) - set(fixed))

    def key(extra: tuple[str, ...]) -> tuple[object, ...]:
        chosen = sorted(fixed + extra)
        pairs = itertools.combinations(chosen, 2)
        return (score(chosen, pair_view), sum(costs.cost(a, b) for a, b in pairs), chosen)

    return min(map(key, itertools.combinations(pool, size - len(fixed))))[2]  # type: ignore[return-value]


@settings(max_examples=600, deadline=None)
@given(data=st.data(), n=st.integers(1, 11), width=st.integers(1, 6))
def test_prefer_equals_the_brute_force_optimum(data: st.DataObject, n: int, width: int) -> None:
    ids = [f"d{i:02d}" for i in range(n)]
    others = [f"o{i}" for i in range(width)]
    # Few distinct partner sets and costs, as on real nodes: classes of alike devices.
    shapes = data.draw(
        st.lists(st.sets(st.sampled_from(others), max_size=3), min_size=1, max_size=4)
    )
    partners = {d: frozenset(data.draw(st.sampled_from(shapes))) for d in ids}
    available = data.draw(st.lists(st.sampled_from(ids), min_size=1, unique=True))
    must = data.draw(st.lists(st.sampled_from(available), max_size=2, unique=True))
    size = data.draw(st.integers(max(len(must), 1), len(available)))
    weight = {d: data.draw(st.integers(0, 3)) for d in ids}
    costs = PairCosts.of(ids, lambda a, b: weight[a] * weight[b])
    pair_view = PairView(
        partners=partners,
        other_free=frozenset(data.draw(st.sets(st.sampled_from(others)))),
        container_other=frozenset(data.draw(st.sets(st.sampled_from(others), max_size=2))),
        this_free=frozenset(data.draw(st.sets(st.sampled_from(ids)))) | set(available) - set(must),
    )
    got = prefer(available, must, size, pair_view, costs)
    assert got == _brute_force(available, must, size, pair_view, costs)


@settings(max_examples=400, deadline=None)
@given(data=st.data(), n=st.integers(2, 11), per_switch=st.integers(1, 3))
def test_prefer_equals_the_brute_force_optimum_where_switches_look_alike(
    data: st.DataObject, n: int, per_switch: int
) -> None:
    """Devices on switches of their own, `per_switch` to a switch and its partners: many
    classes the score cannot tell apart, which the search takes in one order only."""
    ids = [f"d{i:02d}" for i in range(n)]
    switches = (n + per_switch - 1) // per_switch
    others = [f"o{s}" for s in range(switches)]
    partners = {d: frozenset({f"o{i // per_switch}"}) for i, d in enumerate(ids)}
    if data.draw(st.booleans()):
        # One device as near to a second switch's partner: those switches no longer
        # look like the others.
        odd = data.draw(st.sampled_from(ids))
        partners[odd] = partners[odd] | {data.draw(st.sampled_from(others))}
    available = data.draw(st.lists(st.sampled_from(ids), min_size=1, unique=True))
    must = data.draw(st.lists(st.sampled_from(available), max_size=2, unique=True))
    size = data.draw(st.integers(max(len(must), 1), len(available)))
    numa = {d: data.draw(st.integers(0, 1)) for d in ids}
    costs = PairCosts.of(ids, lambda a, b: int(numa[a] != numa[b]))
    pair_view = PairView(
        partners=partners,
        other_free=frozenset(data.draw(st.sets(st.sampled_from(others)))),
        container_other=frozenset(data.draw(st.sets(st.sampled_from(others), max_size=2))),
        this_free=frozenset(data.draw(st.sets(st.sampled_from(ids)))) | set(available) - set(must),
    )
    got = prefer(available, must, size, pair_view, costs)
    assert got == _brute_force(available, must, size, pair_view, costs)
