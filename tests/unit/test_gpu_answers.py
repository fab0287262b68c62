"""A container's edits for a set of GPUs, kept by the resource: the same devices in the
same order get the same edits, the order the kubelet gave is kept, a request beyond the
kept ones is answered afresh; and where every Allocate answer names a response ID of its
own (deviceListStrategy cdi-annotations), no wire answer is given twice."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.config import Flags
from agents.core.topology import Distance
from agents.errors import AllocationError
from agents.gpu import resource as gpu_resource
from agents.gpu.plan import ResourcePlan, Unit
from agents.gpu.resource import AllocateOptions, GpuResource
from agents.kernel.edits import ContainerEdits
from agents.plugin import wire
from agents.plugin.server import DevicePluginServer

GPUS = [f"GPU-{i}" for i in range(4)]
OPTIONS = AllocateOptions(
    flags=Flags(),
    fail_requests_greater_than_one=False,
    minors={g: i for i, g in enumerate(GPUS)},
    mig_caps={},
    dev_root="",
)


def _resource(options: AllocateOptions = OPTIONS) -> GpuResource:
    units = tuple(Unit(g, g, g, numa=0, index=str(i)) for i, g in enumerate(GPUS))
    plan = ResourcePlan("nvidia.com/gpu", units, replicated=False)
    return GpuResource(plan, options, nvlinks={}, pcie=lambda a, b: Distance.SYS)


def _visible(edits: ContainerEdits) -> str:
    return edits.named_env()["NVIDIA_VISIBLE_DEVICES"]


def test_the_same_devices_get_the_same_edits_in_the_kubelets_order() -> None:
    gpus = _resource()
    first = gpus.allocate(["GPU-2", "GPU-0"])
    assert _visible(first) == "GPU-2,GPU-0"
    assert gpus.allocate(["GPU-2", "GPU-0"]) is first
    assert _visible(gpus.allocate(["GPU-0", "GPU-2"])) == "GPU-0,GPU-2"


def test_requests_beyond_the_kept_edits_are_answered_afresh(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(gpu_resource, "ANSWERS_KEPT", 2)
    gpus = _resource()
    for _ in range(2):
        for gpu in GPUS:
            assert _visible(gpus.allocate([gpu])) == gpu


def test_answers_with_a_response_id_each_are_never_reused() -> None:
    flags = Flags(device_list_strategy=frozenset({"cdi-annotations"}))
    edits = _resource().allocate(["GPU-1"])
    assert wire.names_afresh(edits, flags)
    assert not wire.names_afresh(edits, Flags())
    first = wire.allocation_message(edits, flags)
    second = wire.allocation_message(edits, flags)
    assert first.annotations.keys() != second.annotations.keys()
    assert list(first.annotations.values()) == list(second.annotations.values())


class _Held:
    """Devices held through the other API, by physical ID."""

    version = 0

    def __init__(self, *ids: str) -> None:
        self.ids = set(ids)

    def holds(self, resource: str, device_id: str) -> bool:
        return device_id in self.ids

    async def wait_newer(self, version: int) -> None:
        raise NotImplementedError


def test_a_held_gpus_replicas_are_withheld_and_refused(tmp_path: Path) -> None:
    units = tuple(
        Unit(f"{g}::{n}", g, g, numa=0, replica=n, index=str(i))
        for i, g in enumerate(GPUS)
        for n in range(2)
    )
    plan = ResourcePlan("nvidia.com/gpu.shared", units, replicated=True)
    gpus = GpuResource(plan, OPTIONS, nvlinks={}, pcie=lambda a, b: Distance.SYS)
    assert gpus.physical_id("GPU-1::1") == "GPU-1"
    server = DevicePluginServer(gpus, tmp_path, withheld=_Held("GPU-1"))
    listed = {d.id for d in server.visible(gpus.inventory)}
    assert listed == {u.id for u in units} - {"GPU-1::0", "GPU-1::1"}
    with pytest.raises(AllocationError, match="GPU-1::0"):
        server.check_not_withheld(["GPU-0::0", "GPU-1::0"])
    server.check_not_withheld(["GPU-0::0", "GPU-2::1"])
