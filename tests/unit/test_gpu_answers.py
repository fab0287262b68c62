"""Allocate's answer for a set of devices, kept by the resource: the same devices in the
same order get the same answer, the order the kubelet gave is kept, a request beyond the
kept ones is answered afresh, and where every answer names a response ID of its own
(deviceListStrategy cdi-annotations) nothing is kept."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agents.config import Flags
from agents.core.device import ContainerAllocation
from agents.core.topology import Distance
from agents.gpu import resource as gpu_resource
from agents.gpu.plan import ResourcePlan, Unit
from agents.gpu.resource import AllocateOptions, GpuResource

GPUS = [f"GPU-{i}" for i in range(4)]
OPTIONS = AllocateOptions(
    flags=Flags(), fail_requests_greater_than_one=False, minors={}, mig_caps={}, dev_root=""
)


def _resource(options: AllocateOptions = OPTIONS) -> GpuResource:
    units = tuple(Unit(g, g, g, numa=0, index=str(i)) for i, g in enumerate(GPUS))
    plan = ResourcePlan("nvidia.com/gpu", units, replicated=False)
    return GpuResource(plan, options, nvlinks={}, pcie=lambda a, b: Distance.SYS)


def _visible(answer: ContainerAllocation) -> str:
    return answer.envs["NVIDIA_VISIBLE_DEVICES"]


def test_the_same_devices_get_the_same_answer_in_the_kubelets_order() -> None:
    gpus = _resource()
    first = gpus.allocate(["GPU-2", "GPU-0"])
    assert _visible(first) == "GPU-2,GPU-0"
    assert gpus.allocate(["GPU-2", "GPU-0"]) == first
    assert _visible(gpus.allocate(["GPU-0", "GPU-2"])) == "GPU-0,GPU-2"


def test_requests_beyond_the_kept_answers_are_answered_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpu_resource, "ANSWERS_KEPT", 2)
    gpus = _resource()
    for _ in range(2):
        for gpu in GPUS:
            assert _visible(gpus.allocate([gpu])) == gpu


def test_answers_with_a_response_id_each_are_never_reused() -> None:
    flags = Flags(device_list_strategy=frozenset({"cdi-annotations"}))
    gpus = _resource(replace(OPTIONS, flags=flags))
    first = gpus.allocate(["GPU-1"])
    second = gpus.allocate(["GPU-1"])
    assert first.annotations.keys() != second.annotations.keys()
    assert list(first.annotations.values()) == list(second.annotations.values())
