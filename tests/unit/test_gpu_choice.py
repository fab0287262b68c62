"""Preferred allocation: best-connected GPUs against brute force, replica spreading."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from collections.abc import Mapping, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.core.topology import Distance, PciLocation, distance
from hack.benchlib.gpu_choice import choose_gpus, spread_replicas

NvLinks = dict[frozenset[str], int]
Pcie = dict[frozenset[str], Distance]


def pairs_of(*pairs: str) -> list[frozenset[str]]:
    return [frozenset(p.split("-")) for p in pairs]


def brute_force_gpus(
    available: Sequence[str], must: Sequence[str], size: int, nvlinks: NvLinks, pcie: Pcie
) -> list[str]:
    """Every subset scored as (NVLinks between pairs, negated; sum of PCIe
    distances; sorted IDs): the smallest wins."""
    ids = sorted(available)
    links = [[nvlinks.get(frozenset((a, b)), 0) for b in ids] for a in ids]
    far = [[int(pcie.get(frozenset((a, b)), Distance.SYS)) for b in ids] for a in ids]
    fixed = [ids.index(m) for m in must]
    free = [i for i in range(len(ids)) if i not in fixed]

    def key(extra: tuple[int, ...]) -> tuple[int, int, list[str]]:
        chosen = sorted([*fixed, *extra])
        pairs = list(itertools.combinations(chosen, 2))
        return (
            -sum(links[i][j] for i, j in pairs),
            sum(far[i][j] for i, j in pairs),
            [ids[i] for i in chosen],
        )

    return min(map(key, itertools.combinations(free, size - len(fixed))))[2]


# Four GPUs in two PIX pairs on two NUMA nodes: a-b, c-d.
FOUR = ["a", "b", "c", "d"]
FOUR_PCIE: Pcie = {p: Distance.SYS for p in pairs_of("a-c", "a-d", "b-c", "b-d")}
FOUR_PCIE |= {p: Distance.PIX for p in pairs_of("a-b", "c-d")}


@pytest.mark.parametrize(
    ("must", "size", "nvlinks", "expected"),
    [
        ([], 2, {}, ["a", "b"]),
        (["c"], 2, {}, ["c", "d"]),
        ([], 2, {pairs_of("b-c")[0]: 1}, ["b", "c"]),
        (["a"], 2, {pairs_of("a-d")[0]: 2, pairs_of("a-c")[0]: 1}, ["a", "d"]),
        ([], 3, {}, ["a", "b", "c"]),
        (["d"], 3, {}, ["a", "b", "d"]),
        ([], 4, {}, FOUR),
        ([], 0, {}, []),
        (["b", "d"], 2, {}, ["b", "d"]),
    ],
    ids=[
        "same-switch-pair-wins",
        "must-include-pulls-its-switch-partner",
        "one-nvlink-beats-a-nearer-pcie-pair",
        "more-nvlinks-beat-fewer",
        "ties-break-to-smallest-ids",
        "tie-with-must-include-breaks-to-smallest-ids",
        "all-of-them",
        "none",
        "must-include-fills-the-request",
    ],
)
def test_choose_gpus_small_cases(
    must: list[str], size: int, nvlinks: NvLinks, expected: list[str]
) -> None:
    assert choose_gpus(FOUR, must, size, nvlinks=nvlinks, pcie=FOUR_PCIE) == expected


def test_choose_gpus_takes_pcie_distance_as_a_function() -> None:
    def pcie(x: str, y: str) -> Distance:
        return FOUR_PCIE[frozenset((x, y))]

    assert choose_gpus(["d", "c", "b"], [], 2, nvlinks={}, pcie=pcie) == ["c", "d"]


def test_choose_gpus_counts_missing_pcie_pairs_as_farthest() -> None:
    pcie = {frozenset(("b", "c")): Distance.NODE}
    assert choose_gpus(["a", "b", "c"], [], 2, nvlinks={}, pcie=pcie) == ["b", "c"]


@pytest.mark.parametrize(
    ("available", "must", "size"),
    [
        (["a", "b"], [], 3),
        (["a", "b"], ["a"], 0),
        (["a", "b"], ["c"], 1),
        (["a", "a", "b"], [], 2),
        (["a", "b"], ["a", "a"], 2),
        (["a", "b"], [], -1),
    ],
    ids=[
        "more-than-available",
        "fewer-than-must-include",
        "must-include-not-available",
        "repeated-available",
        "repeated-must-include",
        "negative-size",
    ],
)
def test_impossible_requests_are_refused(available: list[str], must: list[str], size: int) -> None:
    with pytest.raises(ValueError):
        choose_gpus(available, must, size, nvlinks={}, pcie={})
    with pytest.raises(ValueError):
        spread_replicas(available, must, size, gpu_of=str, in_use={})


def random_node(rng: random.Random, n: int) -> tuple[list[str], NvLinks, Pcie]:
    """n GPUs on a random PCIe tree (2 NUMA nodes, 2 host bridges each, up to 3
    levels of switches) with a random NVLink mesh of random density."""
    ids = [f"GPU-{i:02d}" for i in range(n)]
    locs = {}
    for i, gpu in enumerate(ids):
        hb = rng.randrange(4)
        root_port = f"{hb}.{rng.randrange(2)}"
        path = [root_port] + [rng.choice("ab") for _ in range(rng.randrange(4))]
        bridges = tuple("/".join(path[: k + 1]) for k in range(len(path)))
        locs[gpu] = PciLocation(f"0000:{i:02x}:00.0", bridges, f"pci0000:{hb:02x}", hb // 2)
    density = rng.choice([0.0, 0.15, 0.4, 1.0])
    nvlinks = {
        frozenset(p): rng.randint(1, 4)
        for p in itertools.combinations(ids, 2)
        if rng.random() < density
    }
    pcie = {
        frozenset((a, b)): distance(locs[a], locs[b]) for a, b in itertools.combinations(ids, 2)
    }
    return ids, nvlinks, pcie


def random_request(rng: random.Random, ids: list[str]) -> tuple[list[str], list[str], int]:
    available = sorted(rng.sample(ids, rng.randint(1, len(ids))))
    size = rng.randint(0, len(available))
    must = rng.sample(available, rng.randint(0, min(size, 3)))
    rng.shuffle(available)
    return available, must, size


@pytest.mark.parametrize("gpus", [8, 16])
def test_choose_gpus_finds_the_brute_force_optimum(gpus: int) -> None:
    rng = random.Random(gpus)
    for _ in range(1000):
        ids, nvlinks, pcie = random_node(rng, gpus)
        available, must, size = random_request(rng, ids)
        got = choose_gpus(available, must, size, nvlinks=nvlinks, pcie=pcie)
        assert len(got) == len(set(got)) == size
        assert set(must) <= set(got) <= set(available)
        assert got == brute_force_gpus(available, must, size, nvlinks, pcie), (available, must)


def test_choose_gpus_finds_the_optimum_for_8_of_16() -> None:
    rng = random.Random(816)
    for _ in range(15):
        ids, nvlinks, pcie = random_node(rng, 16)
        got = choose_gpus(ids, [], 8, nvlinks=nvlinks, pcie=pcie)
        assert got == brute_force_gpus(ids, [], 8, nvlinks, pcie)


def replica_ids(counts: Mapping[str, int]) -> list[str]:
    return [f"{gpu}::{n}" for gpu, count in counts.items() for n in range(count)]


def gpu_of(replica: str) -> str:
    return replica.split("::", maxsplit=1)[0]


@pytest.mark.parametrize(
    ("available", "must", "size", "in_use", "expected"),
    [
        ({"g0": 2, "g1": 2}, [], 2, {}, ["g0::0", "g1::0"]),
        ({"g0": 4, "g1": 4, "g2": 4}, [], 2, {"g0": 1}, ["g1::0", "g2::0"]),
        ({"g0": 4, "g1": 4}, ["g1::3"], 2, {}, ["g1::3", "g0::0"]),
        ({"g0": 3, "g1": 1}, [], 3, {"g0": 1}, ["g1::0", "g0::0", "g0::1"]),
        ({"g0": 2, "g1": 3}, [], 4, {"g1": 1}, ["g0::0", "g1::0", "g0::1", "g1::1"]),
        ({"g0": 12}, [], 2, {}, ["g0::0", "g0::1"]),
    ],
    ids=[
        "one-per-gpu",
        "least-loaded-gpus-first",
        "must-include-counts-as-load",
        "same-gpu-only-when-no-other-left",
        "second-round-goes-to-least-loaded",
        "replica-numbers-in-numeric-order",
    ],
)
def test_spread_replicas_small_cases(
    available: dict[str, int],
    must: list[str],
    size: int,
    in_use: dict[str, int],
    expected: list[str],
) -> None:
    got = spread_replicas(replica_ids(available), must, size, gpu_of=gpu_of, in_use=in_use)
    assert got == expected


@pytest.mark.parametrize(
    ("available", "must", "size", "in_use", "expected"),
    [
        ({"g0": 2, "g1": 2}, [], 2, {}, ["g0::0", "g0::1"]),
        ({"g0": 4, "g1": 4, "g2": 4}, [], 2, {"g1": 1}, ["g1::0", "g1::1"]),
        ({"g0": 4, "g1": 4}, ["g1::3"], 2, {}, ["g1::3", "g1::0"]),
        ({"g0": 1, "g1": 3}, [], 3, {"g0": 3}, ["g0::0", "g1::0", "g1::1"]),
        ({"g0": 2, "g1": 2}, [], 1, {"g0": 1, "g1": 2}, ["g1::0"]),
    ],
    ids=[
        "fills-one-gpu-first",
        "most-loaded-gpu-first",
        "must-include-counts-as-load",
        "next-gpu-when-one-is-full",
        "most-loaded-of-the-free",
    ],
)
def test_packed_replicas_fill_the_most_used_gpus_first(
    available: dict[str, int],
    must: list[str],
    size: int,
    in_use: dict[str, int],
    expected: list[str],
) -> None:
    got = spread_replicas(
        replica_ids(available), must, size, gpu_of=gpu_of, in_use=in_use, packed=True
    )
    assert got == expected


replica_states = st.dictionaries(
    st.sampled_from([f"GPU-{i}" for i in range(6)]), st.integers(1, 4), min_size=1
).flatmap(
    lambda counts: st.tuples(
        st.just(replica_ids(counts)),
        st.dictionaries(st.sampled_from(sorted(counts)), st.integers(0, 8)),
        st.data(),
    )
)


@settings(max_examples=500, deadline=None)
@given(replica_states)
def test_spread_replicas_spreads_over_distinct_gpus_first(
    state: tuple[list[str], dict[str, int], st.DataObject],
) -> None:
    available, in_use, data = state
    size = data.draw(st.integers(0, len(available)))
    must = data.draw(st.lists(st.sampled_from(available), unique=True, max_size=size))
    got = spread_replicas(available, must, size, gpu_of=gpu_of, in_use=in_use)
    assert len(got) == len(set(got)) == size
    assert set(must) <= set(got) <= set(available)
    gpus_used = {gpu_of(r) for r in got}
    all_gpus = {gpu_of(r) for r in available}
    assert len(gpus_used) == min(len(all_gpus), len({gpu_of(r) for r in must}) + size - len(must))
    load = Counter(gpu_of(r) for r in got)
    if got and len(gpus_used) < len(all_gpus) and not must:
        unused = all_gpus - gpus_used
        # A GPU left out never carries less load than one that was taken.
        assert min(in_use.get(g, 0) for g in unused) >= max(
            in_use.get(g, 0) + load[g] - 1 for g in gpus_used
        )
