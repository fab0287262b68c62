"""The pure side of ResourceSlices: names, health, and reading a stored slice back as
kube-apiserver v1.34 writes it (quantities canonical, taints timed)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from agents.core.health import DeviceHealth, GpuLost, Xids
from agents.core.quantity import quantity
from agents.dra.slices import build_slices, causes_of, same_spec, slice_name
from agents.kernel.facts import DeviceFacts, FamilyFacts

GPUS = FamilyFacts(
    "gpu.nvidia.com",
    tuple(
        DeviceFacts(f"gpu-{i}", "nvidia.com/gpu", f"GPU-{i}", {}, {"memory": "81920Mi"})
        for i in range(2)
    ),
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80Gi", 80 * 2**30),
        ("81920Mi", 80 * 2**30),
        ("1e3", 1000),
        ("1k", 1000),
        ("500m", Fraction(1, 2)),
    ],
    ids=["Gi", "Mi", "exponent", "k", "milli"],
)
def test_quantities_read_as_exact_values(text: str, value: Fraction | int) -> None:
    assert quantity(text) == value


def test_a_slice_as_the_api_server_writes_it_back_is_the_same() -> None:
    (wanted,) = build_slices("n", "uid", GPUS, {"gpu-1": Xids((79,))}, taints=True, generation=0)
    stored = {"spec": {**wanted["spec"], "devices": [dict(d) for d in wanted["spec"]["devices"]]}}
    for device in stored["spec"]["devices"]:
        device["capacity"] = {"memory": {"value": "80Gi"}}
    stored["spec"]["devices"][1]["taints"] = [
        {**wanted["spec"]["devices"][1]["taints"][0], "timeAdded": "2026-11-25T22:10:22Z"}
    ]
    assert same_spec(stored, wanted)
    stored["spec"]["devices"][1]["taints"] = []
    assert not same_spec(stored, wanted)


def test_each_device_has_the_cause_its_resource_and_id_are_told() -> None:
    health = [
        DeviceHealth("nvidia.com/gpu", "GPU-1", "GPU 1", Xids((79,))),
        DeviceHealth("nvidia.com/gpu", "GPU-0", "GPU 0"),
        DeviceHealth("other", "GPU-0", "x", GpuLost()),
    ]
    assert causes_of(GPUS, health) == {"gpu-0": None, "gpu-1": Xids((79,))}
    assert causes_of(GPUS, []) == {"gpu-0": None, "gpu-1": None}  # none told: Healthy


def test_a_long_node_name_still_gives_a_valid_distinct_slice_name() -> None:
    node = "n" * 250
    names = {slice_name(node, "gpu.nvidia.com", i) for i in range(3)}
    assert len(names) == 3
    assert all(len(n) <= 253 for n in names)
    assert slice_name("node-1", "gpu.nvidia.com", 0) == "node-1-gpu-nvidia-com-0"
