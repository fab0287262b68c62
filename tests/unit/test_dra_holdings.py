"""What device-plugin mode withholds of the DRA checkpoints: held devices and the
time-slicing replicas of a held GPU; never an adminAccess device (not exclusive)."""

from __future__ import annotations

from pathlib import Path

from agents.core.device import DeviceNode
from agents.dra.claim_checkpoint import ClaimCheckpoint, PreparedClaim, PreparedDevice
from agents.dra.holdings import DraHoldings
from agents.kernel.kubelet_facts import PodResources

NODE = (DeviceNode("/dev/null", "/dev/null"),)


async def test_held_devices_are_withheld_under_any_resource_name(tmp_path: Path) -> None:
    devices = (
        PreparedDevice("gpu-0", ("a",), "n", (), NODE, False, "nvidia.com/gpu", "GPU-0"),
        PreparedDevice("gpu-1", ("b",), "n", (), NODE, True, "nvidia.com/gpu", "GPU-1"),
    )
    path = tmp_path / "gpu.nvidia.com" / "checkpoint.json"
    ClaimCheckpoint(path).save({"u": PreparedClaim("ns", "c", devices)})
    holdings = DraHoldings(tmp_path, tmp_path / "registry", tmp_path / "cdi", PodResources(None))
    await holdings.restore(["gpu.nvidia.com", "roce.node-agents.io"])
    assert holdings.holds("nvidia.com/gpu", "GPU-0")
    assert not holdings.holds("nvidia.com/gpu", "GPU-1")  # adminAccess
    assert not holdings.holds("nvidia.com/gpu", "GPU-00")
    assert holdings.holds("nvidia.com/gpu.shared", "GPU-0")  # renamed by time-slicing
    assert not holdings.holds("nvidia.com/gpu.shared", "GPU-2")
    assert holdings.version == 1


async def test_a_corrupt_checkpoint_holds_nothing_and_is_kept_aside(tmp_path: Path) -> None:
    path = tmp_path / "gpu.nvidia.com" / "checkpoint.json"
    path.parent.mkdir()
    path.write_text("{not json")
    holdings = DraHoldings(tmp_path, tmp_path / "registry", tmp_path / "cdi", PodResources(None))
    await holdings.restore(["gpu.nvidia.com"])
    assert not holdings.holds("nvidia.com/gpu", "GPU-0")
    assert path.with_name("checkpoint.json.corrupt").read_text() == "{not json"
