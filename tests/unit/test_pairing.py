"""Pairing: the pure choice (agents.core.pairing) and the ledger across two resources."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import pytest
import structlog.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.core.pairing import PairView, prefer, score
from agents.core.subsets import PairCosts
from agents.pairing import GPU, NIC, PairingLedger

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


# The ledger


def ledger(shape: str = "one-to-one") -> PairingLedger:
    if shape == "two-to-one":
        return PairingLedger(TWO_TO_ONE, TWO_TO_ONE_NICS)
    return PairingLedger(ONE_TO_ONE, ONE_TO_ONE_NICS)


def admit(
    book: PairingLedger, first: tuple[str, int], second: tuple[str, int] | None
) -> dict[str, list[str]]:
    """One container, as the kubelet asks: prefer then allocate, resource by resource."""
    got: dict[str, list[str]] = {}
    for kind, size in [first] if second is None else [first, second]:
        side = book.side(kind)
        free = sorted((ONE_TO_ONE if kind == GPU else ONE_TO_ONE_NICS).keys())
        got[kind] = side.prefer(free, [], size)
        side.allocated(got[kind])
    book.container_done()
    return got


@pytest.mark.parametrize(
    ("first", "second"),
    [((GPU, 2), (NIC, 2)), ((NIC, 2), (GPU, 2)), ((GPU, 1), (NIC, 1)), ((NIC, 3), (GPU, 3))],
    ids=["gpu-first-2", "nic-first-2", "gpu-first-1", "nic-first-3"],
)
def test_ledger_second_resource_takes_the_partners_of_the_first(
    first: tuple[str, int], second: tuple[str, int]
) -> None:
    got = admit(ledger(), first, second)
    assert {n for g in got[GPU] for n in ONE_TO_ONE[g]} == set(got[NIC])


def test_ledger_first_resource_prefers_devices_whose_partners_are_free() -> None:
    book = ledger()
    nic = book.side(NIC)
    nic.prefer(["n0", "n1", "n2", "n3"], [], 2)
    nic.allocated(["n0", "n1"])  # a NIC-only container holds n0, n1
    book.container_done()
    assert book.side(GPU).prefer(GPUS, [], 2) == ["g2", "g3"]


def test_ledger_boundary_from_the_checkpoint_ends_the_pairing_with_the_last_container() -> None:
    book = ledger()
    gpu, nic = book.side(GPU), book.side(NIC)
    gpu.prefer(GPUS, [], 1)
    gpu.allocated(["g0"])
    book.container_done()  # a GPU-only container
    # The next container's NIC is not pulled towards g0's partner, which is free to pair.
    assert nic.prefer(["n0", "n1", "n2", "n3"], [], 1) != ["n0"]


def test_ledger_learns_that_a_released_containers_other_devices_are_free() -> None:
    book = ledger()
    gpu, nic = book.side(GPU), book.side(NIC)
    gpu.prefer(["g2", "g3"], [], 2)
    gpu.allocated(["g2", "g3"])
    nic.prefer(["n0", "n1", "n2", "n3"], [], 2)
    nic.allocated(["n2", "n3"])
    book.container_done()  # a GPU+NIC container: g2, g3 with n2, n3
    nic.prefer(["n0", "n1"], [], 2)
    nic.allocated(["n0", "n1"])
    book.container_done()  # a NIC-only container: n0, n1
    # The first pod ended: the kubelet offers g2, g3 again, so n2, n3 are free as well,
    # and a GPU asked first goes where its partner is (g0's and g1's NICs are held).
    assert gpu.prefer(GPUS, [], 1) in (["g2"], ["g3"])


def test_ledger_single_kind_container_keeps_free_pairs_whole_where_possible() -> None:
    book = ledger("two-to-one")
    gpu = book.side(GPU)
    gpu.prefer(["g0", "g1", "g2", "g3"], [], 1)
    gpu.allocated(["g1"])
    book.container_done()
    # With n0 half used by g1's container, a one-GPU container takes g0, not a GPU of
    # the whole pair g2, g3.
    assert gpu.prefer(["g0", "g2", "g3"], [], 1) == ["g0"]


def test_ledger_without_checkpoint_signal_logs_once_and_still_pairs() -> None:
    book = ledger()
    gpu, nic = book.side(GPU), book.side(NIC)
    held: dict[str, set[str]] = {GPU: set(), NIC: set()}
    with structlog.testing.capture_logs() as logs:
        for _ in range(3):  # three containers, no rename between them
            picked = gpu.prefer(sorted(set(GPUS) - held[GPU]), [], 1)
            gpu.allocated(picked)
            got = nic.prefer(sorted(set(ONE_TO_ONE_NICS) - held[NIC]), [], 1)
            nic.allocated(got)
            assert set(got) == ONE_TO_ONE[picked[0]]
            held[GPU].update(picked)
            held[NIC].update(got)
    warnings = [e for e in logs if e["event"] == "pairing_without_checkpoint_signal"]
    assert len(warnings) == 1
    assert warnings[0]["log_level"] == "warning"


def test_ledger_forgets_a_container_whose_admission_failed_half_way() -> None:
    book = ledger()
    gpu, nic = book.side(GPU), book.side(NIC)
    gpu.allocated(["g2"])
    nic.allocated(["n1"])
    book.container_done()  # B holds g2 and n1 throughout
    nic.prefer(["n0", "n2", "n3"], [], 1)
    nic.allocated(["n0"])  # F got n0, then its GPUs did not fit: no rename
    gpu.prefer(["g0", "g1", "g3"], [], 1)
    gpu.allocated(["g3"])  # C, GPU first
    assert nic.prefer(["n0", "n2", "n3"], [], 1) == ["n3"]  # n0 offered again: F is gone
    nic.allocated(["n3"])
    book.container_done()  # C holds g3 and n3, and nothing of F's
    nic.prefer(["n0", "n2"], [], 1)
    nic.allocated(["n0"])
    book.container_done()  # E, NIC only
    gpu.prefer(["g0", "g1"], [], 1)
    gpu.allocated(["g0"])
    book.container_done()  # G, GPU only
    # C ended: its NIC n3 is offered, so its GPU g3 is free too and n3 pairs; n2's g2 is B's.
    assert nic.prefer(["n2", "n3"], [], 1) == ["n3"]


def test_ledger_first_resource_leans_towards_devices_of_a_pod_that_may_have_ended() -> None:
    book = ledger()
    gpu, nic = book.side(GPU), book.side(NIC)
    gpu.allocated(["g2"])
    nic.allocated(["n0"])
    book.container_done()  # A, GPU+NIC: g2 with n0
    nic.allocated(["n1"])
    book.container_done()  # B, NIC only: n1; its pod may end without the kubelet saying so
    gpu.allocated(["g3"])
    book.container_done()  # C, GPU only: g3
    # Neither free GPU has a partner known to be free (n2, n3 belong to held GPUs). g1's
    # partner n1 is free as soon as B's pod is gone; g0's partner is held by A with a GPU.
    assert gpu.prefer(["g0", "g1"], [], 1) == ["g1"]
    # A's pod ends (g2 offered again): g0 and g2 now have partners known to be free,
    # and those win over g1, whose partner only may be.
    assert gpu.prefer(["g0", "g1", "g2"], [], 1) != ["g1"]


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
