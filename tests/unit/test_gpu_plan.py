"""Which resources GPUs are offered as: MIG strategy, device IDs and time-slicing, by table."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import structlog

from agents.config import MAX_REPLICAS, MAX_SHARED_DEVICES, parse_config
from agents.errors import ConfigError
from agents.gpu.discovery import Gpu
from agents.gpu.plan import ResourcePlan, Unit, plan_resources
from agents.hw.nvml import MigInstance

SOURCE = "plan.yaml"


def gpu(index: int, *profiles: str) -> Gpu:
    """GPU-<index>; in MIG mode with instances MIG-<index>-<n> when given profiles."""
    return Gpu(
        index=index,
        uuid=f"GPU-{index}",
        pci=f"0000:{index + 0x10:02x}:00.0",
        numa=index % 2,
        minor=index,
        model="NVIDIA H100 80GB HBM3",
        memory_mib=81559,
        mig_enabled=bool(profiles),
        mig=tuple(MigInstance(f"MIG-{index}-{n}", p, n, 0) for n, p in enumerate(profiles)),
        nvlink_peers=(),
        location=None,
    )


TWO_WHOLE = [gpu(0), gpu(1)]
MIXED_NODE = [gpu(0, "1g.10gb", "1g.10gb", "3g.40gb"), gpu(1)]
ONE_PROFILE = [gpu(0, "1g.10gb", "1g.10gb"), gpu(1, "1g.10gb")]


def plan(gpus: Sequence[Gpu], config: str) -> list[ResourcePlan]:
    return plan_resources(gpus, parse_config(config, SOURCE), SOURCE)


def ids(plans: Sequence[ResourcePlan]) -> dict[str, list[str]]:
    return {p.name: [u.id for u in p.units] for p in plans}


def sliced(replicas: int, *, name: str = "nvidia.com/gpu", extra: str = "") -> str:
    return (
        f"sharing:\n  timeSlicing:\n{extra}    resources:\n"
        f"      - {{name: {name}, replicas: {replicas}}}\n"
    )


@pytest.mark.parametrize(
    ("gpus", "config", "expected"),
    [
        (TWO_WHOLE, "", {"nvidia.com/gpu": ["GPU-0", "GPU-1"]}),
        (TWO_WHOLE, "flags: {deviceIDStrategy: index}", {"nvidia.com/gpu": ["GPU-0", "GPU-1"]}),
        (MIXED_NODE, "flags: {migStrategy: none}", {"nvidia.com/gpu": ["GPU-0", "GPU-1"]}),
        (
            MIXED_NODE,
            "flags: {migStrategy: mixed}",
            {
                "nvidia.com/gpu": ["GPU-1"],
                "nvidia.com/mig-1g.10gb": ["MIG-0-0", "MIG-0-1"],
                "nvidia.com/mig-3g.40gb": ["MIG-0-2"],
            },
        ),
        (
            MIXED_NODE,
            "flags: {migStrategy: mixed, deviceIDStrategy: index}",
            {
                "nvidia.com/gpu": ["GPU-1"],
                "nvidia.com/mig-1g.10gb": ["MIG-0-0", "MIG-0-1"],
                "nvidia.com/mig-3g.40gb": ["MIG-0-2"],
            },
        ),
        (TWO_WHOLE, "flags: {migStrategy: mixed}", {"nvidia.com/gpu": ["GPU-0", "GPU-1"]}),
        (
            ONE_PROFILE,
            "flags: {migStrategy: single}",
            {"nvidia.com/gpu": ["MIG-0-0", "MIG-0-1", "MIG-1-0"]},
        ),
        (
            TWO_WHOLE,
            sliced(2),
            {"nvidia.com/gpu": ["GPU-0::0", "GPU-0::1", "GPU-1::0", "GPU-1::1"]},
        ),
        (
            TWO_WHOLE,
            "flags: {deviceIDStrategy: index}\n" + sliced(2),
            {"nvidia.com/gpu": ["GPU-0::0", "GPU-0::1", "GPU-1::0", "GPU-1::1"]},
        ),
        (
            [gpu(0)],
            sliced(3, extra="    renameByDefault: true\n"),
            {"nvidia.com/gpu.shared": ["GPU-0::0", "GPU-0::1", "GPU-0::2"]},
        ),
        (
            [gpu(0)],
            sliced(1, extra="    renameByDefault: true\n"),
            {"nvidia.com/gpu.shared": ["GPU-0::0"]},
        ),
        (
            MIXED_NODE,
            "flags: {migStrategy: mixed}\n" + sliced(2, name="nvidia.com/mig-3g.40gb"),
            {
                "nvidia.com/gpu": ["GPU-1"],
                "nvidia.com/mig-1g.10gb": ["MIG-0-0", "MIG-0-1"],
                "nvidia.com/mig-3g.40gb": ["MIG-0-2::0", "MIG-0-2::1"],
            },
        ),
        ([], "flags: {migStrategy: mixed}", {}),
    ],
    ids=[
        "whole",
        "whole-index",
        "mig-gpu-under-none-is-whole",
        "mixed",
        "mixed-index-leaves-mig-uuids",
        "mixed-without-mig",
        "single-one-profile",
        "replicas",
        "replicas-index-keep-uuids",
        "renameByDefault",
        "one-replica-still-renamed",
        "replicas-of-a-mig-profile",
        "no-gpus",
    ],
)
def test_resources_and_device_ids(
    gpus: Sequence[Gpu], config: str, expected: dict[str, list[str]]
) -> None:
    assert ids(plan(gpus, config)) == expected


@pytest.mark.parametrize(
    ("gpus", "found"),
    [
        (MIXED_NODE, "GPU-1"),
        ([gpu(0, "1g.10gb"), gpu(1, "2g.20gb")], "['1g.10gb', '2g.20gb']"),
        ([gpu(0, "1g.10gb", "3g.40gb")], "['1g.10gb', '3g.40gb']"),
        ([gpu(0, "1g.10gb"), gpu(1, "1g.10gb"), gpu(2)], "GPU-2"),
        ([gpu(0, "1g.10gb"), Gpu(**{**vars(gpu(1)), "mig_enabled": True})], "without instances"),
    ],
    ids=[
        "a-whole-gpu",
        "two-profiles-across-gpus",
        "two-profiles-on-one-gpu",
        "a-whole-gpu-among-mig",
        "a-mig-gpu-without-instances",
    ],
)
def test_single_refuses_nodes_without_exactly_one_profile(gpus: Sequence[Gpu], found: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan(gpus, "flags: {migStrategy: single}")
    assert (err.value.source, err.value.key) == (SOURCE, "flags.migStrategy")
    assert found in err.value.expected


@pytest.mark.parametrize(
    ("config", "gpus", "logged"),
    [
        ("flags: {migStrategy: single}", TWO_WHOLE, ["mig_strategy_without_mig"]),
        ("flags: {migStrategy: single}\n" + sliced(2), TWO_WHOLE, ["mig_strategy_without_mig"]),
        ("flags: {migStrategy: single}", [], []),
    ],
    ids=["whole-gpus", "whole-gpus-time-sliced", "no-gpus"],
)
def test_single_on_a_node_without_mig_serves_whole_gpus_with_a_warning(
    config: str, gpus: Sequence[Gpu], logged: list[str]
) -> None:
    with structlog.testing.capture_logs() as logs:
        got = plan(gpus, config)
    assert got == plan(gpus, config.replace("single", "none"))
    assert [(e["event"], e["log_level"]) for e in logs] == [(e, "warning") for e in logged]


@pytest.mark.parametrize(
    ("gpus", "config", "unit"),
    [
        (TWO_WHOLE, "", Unit("GPU-1", "GPU-1", "GPU-1", 1, index="1")),
        (TWO_WHOLE, sliced(2), Unit("GPU-1::1", "GPU-1", "GPU-1", 1, replica=1, index="1")),
        (
            TWO_WHOLE,
            "flags: {deviceIDStrategy: index}\n" + sliced(2),
            Unit("GPU-1::1", "GPU-1", "GPU-1", 1, replica=1, index="1"),
        ),
        (
            MIXED_NODE,
            "flags: {migStrategy: mixed}",
            Unit("MIG-0-2", "GPU-0", "MIG-0-2", 0, index="0:2"),
        ),
        (
            [gpu(0), gpu(1, "1g.10gb", "1g.10gb")],
            "flags: {migStrategy: mixed}\n" + sliced(2, name="mig-1g.10gb"),
            Unit("MIG-1-1::0", "GPU-1", "MIG-1-1", 1, replica=0, index="1:1"),
        ),
    ],
    ids=["whole", "replica", "replica-index", "mig", "mig-replica"],
)
def test_units_know_their_gpu_visible_id_index_and_numa(
    gpus: Sequence[Gpu], config: str, unit: Unit
) -> None:
    units = {u.id: u for p in plan(gpus, config) for u in p.units}
    assert units[unit.id] == unit


def test_devices_of_a_time_slicing_entry_are_ignored_every_gpu_is_shared() -> None:
    config = sliced(2).replace("replicas: 2}", "replicas: 2, devices: [0]}")
    assert ids(plan(TWO_WHOLE, config)) == ids(plan(TWO_WHOLE, sliced(2)))


@pytest.mark.parametrize(
    ("config", "replicated"),
    [("", False), (sliced(1), True), (sliced(4), True)],
    ids=["whole", "one-replica", "four-replicas"],
)
def test_only_time_sliced_plans_are_replicated(config: str, replicated: bool) -> None:
    assert [p.replicated for p in plan(TWO_WHOLE, config)] == [replicated]


def test_a_rename_onto_an_offered_resource_is_a_config_error() -> None:
    config = "flags: {migStrategy: mixed}\n" + sliced(2).replace(
        "replicas: 2}", "replicas: 2, rename: nvidia.com/mig-3g.40gb}"
    )
    with pytest.raises(ConfigError) as err:
        plan(MIXED_NODE, config)
    assert err.value.key == "sharing.timeSlicing.resources[].rename"
    assert "nvidia.com/mig-3g.40gb" in err.value.expected


def test_time_sliced_devices_up_to_the_node_bound_are_planned() -> None:
    gpus = [gpu(i) for i in range(MAX_SHARED_DEVICES // MAX_REPLICAS)]
    (shared,) = plan(gpus, sliced(MAX_REPLICAS))
    assert len(shared.units) == MAX_SHARED_DEVICES == 16384


def test_more_time_sliced_devices_than_the_node_bound_is_a_config_error_naming_the_entry() -> None:
    gpus = [gpu(i, *["1g.10gb"] * 7) for i in range(3)]  # 21 MIG instances
    config = (
        "flags: {migStrategy: mixed}\n"
        "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4},"
        f" {{name: nvidia.com/mig-1g.10gb, replicas: {MAX_REPLICAS}}}]}}}}\n"
    )
    with pytest.raises(ConfigError) as err:
        plan(gpus, config)
    assert err.value.key == "sharing.timeSlicing.resources[1].replicas"
    assert err.value.expected.startswith(f"at most {MAX_SHARED_DEVICES} time-sliced devices")
    assert "21 nvidia.com/mig-1g.10gb devices bring this node to 21504" in err.value.expected


MPS = (
    "flags: {mpsRoot: /run/nvidia/mps%s}\n"
    "sharing: {mps: {%sresources: [{name: nvidia.com/gpu, replicas: 2}]}}\n"
)


def test_mps_replicas_are_named_as_time_sliced_ones_and_served_through_mps() -> None:
    (shared,) = plan(TWO_WHOLE, MPS % ("", "renameByDefault: true, "))
    assert shared.name == "nvidia.com/gpu.shared"
    assert [u.id for u in shared.units] == ["GPU-0::0", "GPU-0::1", "GPU-1::0", "GPU-1::1"]
    assert shared.replicated and shared.mps
    (sliced_,) = plan(TWO_WHOLE, sliced(2))
    assert not sliced_.mps


@pytest.mark.parametrize("strategy", ["none", "single"])
def test_mps_on_a_gpu_in_mig_mode_is_a_config_error_naming_sharing_mps(strategy: str) -> None:
    with pytest.raises(ConfigError) as err:
        plan(ONE_PROFILE, MPS % (f", migStrategy: {strategy}", ""))
    assert err.value.key == "sharing.mps"
    assert "MIG is enabled on GPU-0, GPU-1" in str(err.value)
