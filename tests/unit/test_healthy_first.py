"""Degraded devices last in the preferred allocation: the pure narrowing, the grades a
resource advertises, and both families' choices (docs/degraded.md)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.config import Flags
from agents.core.device import Device
from agents.core.health import Grade
from agents.core.healthy_first import graded, healthy_first
from agents.core.topology import Distance
from agents.gpu.plan import ResourcePlan, Unit
from agents.gpu.resource import AllocateOptions, GpuResource
from agents.roce.discovery import Nic
from agents.roce.resource import RoceResource

IDS = [f"d{i}" for i in range(6)]


@pytest.mark.parametrize(
    ("available", "must", "size", "degraded", "want"),
    [
        (IDS, [], 2, set(), (IDS, [])),
        (IDS, [], 2, {"d0", "d1"}, (IDS[2:], [])),
        (IDS, [], 4, {"d0", "d1"}, (IDS[2:], [])),
        # Too few Healthy: every Healthy one fixed, the choice adds Degraded ones.
        (IDS, [], 5, {"d0", "d1"}, (IDS, IDS[2:])),
        # A Degraded device the kubelet must include stays, and counts.
        (IDS, ["d0"], 2, {"d0", "d1"}, (["d0", *IDS[2:]], ["d0"])),
        (IDS, ["d0"], 6, {"d0", "d1"}, (IDS, ["d0", *IDS[2:]])),
    ],
    ids=["none", "enough", "just-enough", "too-few", "must-degraded", "must-too-few"],
)
def test_healthy_first_narrows_to_healthy_devices_where_they_are_enough(
    available: list[str],
    must: list[str],
    size: int,
    degraded: set[str],
    want: tuple[list[str], list[str]],
) -> None:
    assert healthy_first(available, must, size, degraded) == want


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_a_choice_over_the_narrowed_request_uses_degraded_devices_only_where_needed(
    data: st.DataObject,
) -> None:
    available = data.draw(st.lists(st.sampled_from(IDS), min_size=1, unique=True))
    must = data.draw(st.lists(st.sampled_from(available), max_size=2, unique=True))
    size = data.draw(st.integers(max(len(must), 1), len(available)))
    degraded = data.draw(st.sets(st.sampled_from(IDS)))
    pool, fixed = healthy_first(available, must, size, degraded)
    assert set(fixed) >= set(must) and set(pool) >= set(fixed) and len(pool) >= size
    # Any choice of `size` from pool that keeps `fixed` takes as few Degraded as can be.
    chosen = [*fixed, *sorted(set(pool) - set(fixed))][:size]
    healthy = [d for d in available if d not in degraded]
    fewest = max(0, size - len(set(healthy) | set(must))) + len(set(must) & degraded)
    assert len(set(chosen) & degraded) == fewest


@pytest.mark.parametrize(
    ("grade", "degraded_unhealthy", "healthy", "degraded"),
    [
        (Grade.HEALTHY, False, True, False),
        (Grade.DEGRADED, False, True, True),
        (Grade.DEGRADED, True, False, True),
        (Grade.UNHEALTHY, False, False, False),
        (Grade.UNHEALTHY, True, False, False),
    ],
    ids=["healthy", "degraded", "degraded-reported-unhealthy", "unhealthy", "unhealthy-too"],
)
def test_a_graded_device_tells_the_kubelet_healthy_unless_so_configured(
    grade: Grade, degraded_unhealthy: bool, healthy: bool, degraded: bool
) -> None:
    device = graded("d0", grade, 1, degraded_unhealthy=degraded_unhealthy)
    assert device == Device("d0", healthy, 1, degraded)


def _gpus(degraded_unhealthy: bool = False) -> GpuResource:
    units = tuple(Unit(f"GPU-{i}", f"GPU-{i}", f"GPU-{i}", 0) for i in range(4))
    options = AllocateOptions(Flags(), False, {}, {}, "")
    # GPU-0 and GPU-1 share an NVLink: the best pair, unless one of them is Degraded.
    nvlinks = {frozenset(p): 0 for p in itertools.combinations([u.id for u in units], 2)}
    nvlinks[frozenset(("GPU-0", "GPU-1"))] = 4
    return GpuResource(
        ResourcePlan("nvidia.com/gpu", units, replicated=False),
        options,
        nvlinks=nvlinks,
        pcie=lambda a, b: Distance.SYS,
        clock=lambda: 0.0,
        degraded_unhealthy=degraded_unhealthy,
    )


def test_gpu_resource_prefers_healthy_gpus_over_an_nvlinked_pair() -> None:
    gpus = _gpus()
    ids = [f"GPU-{i}" for i in range(4)]
    assert gpus.preferred(ids, [], 2) == ["GPU-0", "GPU-1"]
    grades = dict.fromkeys(ids, Grade.HEALTHY) | {"GPU-1": Grade.DEGRADED}
    assert gpus.set_health(grades)
    assert not gpus.set_health(grades)  # the same grades: no change
    assert gpus.preferred(ids, [], 2) == ["GPU-0", "GPU-2"]  # its NVLink partner goes
    assert gpus.preferred(ids, [], 4) == ids  # where nothing else is left
    assert gpus.inventory.get("GPU-1") == Device("GPU-1", True, 0, True)


def test_gpu_resource_reports_a_degraded_gpu_unhealthy_when_so_configured() -> None:
    gpus = _gpus(degraded_unhealthy=True)
    gpus.set_health({f"GPU-{i}": Grade.DEGRADED if i == 3 else Grade.HEALTHY for i in range(4)})
    assert gpus.inventory.get("GPU-3") == Device("GPU-3", False, 0, True)


def _nic(i: int, numa: int) -> Nic:
    return Nic(f"0000:0{i}:00.0", f"mlx5_{i}", 1, f"ens{i}np0", f"uverbs{i}", numa, None)


def test_roce_resource_takes_grades_and_prefers_healthy_nics_over_numa() -> None:
    nics = [_nic(0, 0), _nic(1, 0), _nic(2, 1)]
    roce = RoceResource("rdma/roce", nics)
    ids = [n.pci for n in nics]
    assert roce.preferred(ids, [ids[0]], 2) == ids[:2]  # the same NUMA node
    assert roce.set_health({ids[0]: Grade.HEALTHY, ids[1]: Grade.DEGRADED, ids[2]: Grade.HEALTHY})
    assert roce.preferred(ids, [ids[0]], 2) == [ids[0], ids[2]]
    assert sorted(roce.preferred(ids, [], 3)) == ids
    # The family's bools go on working: a NIC left out is Unhealthy.
    roce.set_nics(nics, {ids[0]: True, ids[1]: Grade.DEGRADED})
    assert [(d.healthy, d.degraded) for d in roce.inventory.devices] == [
        (True, False),
        (True, True),
        (False, False),
    ]
