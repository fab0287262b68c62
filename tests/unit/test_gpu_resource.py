"""The GPU resource's preferred choice: its cached costs and replica index answer as the
pure choices of agents.core.gpu_choice do (hack/benchlib/gpu_choice as one call)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.config import Flags
from agents.core.topology import Distance
from agents.gpu.plan import REPLICA_SEPARATOR, ResourcePlan, Unit
from agents.gpu.resource import AllocateOptions, GpuResource
from hack.benchlib.gpu_choice import choose_gpus, spread_replicas

OPTIONS = AllocateOptions(
    flags=Flags(),
    fail_requests_greater_than_one=False,
    minors={},
    mig_caps={},
    dev_root="",
)
GPUS = [f"GPU-{i}" for i in range(6)]
PAIRS = [frozenset(p) for p in itertools.combinations(GPUS, 2)]


def stopped_clock() -> float:
    """Time that never passes: the search's budget never runs out, so on a loaded
    machine it still reaches the proven best that the reference computes."""
    return 0.0


def resource(plan: ResourcePlan, nvlinks: dict[frozenset[str], int], far: Distance) -> GpuResource:
    return GpuResource(plan, OPTIONS, nvlinks=nvlinks, pcie=lambda a, b: far, clock=stopped_clock)


@settings(max_examples=300, deadline=None)
@given(
    replicas=st.lists(st.integers(1, 12), min_size=1, max_size=len(GPUS)),
    data=st.data(),
)
def test_replicas_spread_as_spread_replicas_says(replicas: list[int], data: st.DataObject) -> None:
    units = tuple(
        Unit(f"{gpu}{REPLICA_SEPARATOR}{n}", gpu, gpu, 0, n)
        for gpu, count in zip(GPUS, replicas, strict=False)
        for n in range(count)
    )
    gpu_res = resource(ResourcePlan("nvidia.com/gpu", units, replicated=True), {}, Distance.SYS)
    ids = [u.id for u in units]
    gpu_of = {u.id: u.gpu_uuid for u in units}
    for _ in range(3):  # the index is built once and reused
        available = data.draw(st.lists(st.sampled_from(ids), min_size=1, unique=True))
        must = data.draw(st.lists(st.sampled_from(available), max_size=2, unique=True))
        size = data.draw(st.integers(max(len(must), 1), len(available)))
        in_use = {
            g: sum(1 for i in ids if gpu_of[i] == g) - sum(1 for i in available if gpu_of[i] == g)
            for g in set(gpu_of.values())
        }
        want = spread_replicas(available, must, size, gpu_of=gpu_of.__getitem__, in_use=in_use)
        assert gpu_res.preferred(available, must, size) == want


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_whole_gpus_choose_as_choose_gpus_says(data: st.DataObject) -> None:
    nvlinks = {p: data.draw(st.integers(0, 3)) for p in PAIRS}
    far = data.draw(st.sampled_from(list(Distance)))
    units = tuple(Unit(g, g, g, 0) for g in GPUS)
    gpu_res = resource(ResourcePlan("nvidia.com/gpu", units, replicated=False), nvlinks, far)
    for _ in range(3):  # the costs are built once and reused
        available = data.draw(st.lists(st.sampled_from(GPUS), min_size=1, unique=True))
        must = data.draw(st.lists(st.sampled_from(available), max_size=2, unique=True))
        size = data.draw(st.integers(max(len(must), 1), len(available)))
        want = choose_gpus(available, must, size, nvlinks=nvlinks, pcie={p: far for p in PAIRS})
        assert gpu_res.preferred(available, must, size) == want
