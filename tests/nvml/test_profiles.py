"""The GPU node descriptions of tests/nvml/profiles: each loads, and holds the facts the
real-backend suites rely on; a description that does not hold is refused by key."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.hw.nvml import ARCHITECTURES
from tests.nvml.harness import NVSWITCH_PROFILES
from tests.nvml.nodes import (
    MIG_LAYOUTS,
    PROFILE_DIR,
    PROFILES,
    ProfileError,
    from_profile,
    load_profile,
    profile_path,
    with_mig,
)
from tests.nvml.state import NVLINK_SWITCH, NVSWITCH_BUS_ID

GIB = 2**30
# What each node is: GPUs, memory per GPU, NUMA nodes, NVLinks per GPU, MIG capable.
FACTS = {
    "a100": (8, 40 * GIB, {0, 1}, 12, True),
    "b200": (8, 192 * GIB, {0, 1}, 0, True),
    "gb200": (8, 192 * GIB, {0, 1, 2, 3}, 18, True),
    "gb300": (8, 288 * GIB, {0, 1, 2, 3}, 18, True),
    "h100": (8, 80 * GIB, {0, 1}, 18, True),
    "l40s": (8, 48 * GIB, {0, 1}, 0, False),
    "t4": (4, 16 * GIB, {0}, 0, False),
}


def test_every_description_in_the_folder_is_a_profile_the_suites_run() -> None:
    assert sorted(p.stem for p in PROFILE_DIR.glob("*.yaml")) == sorted(PROFILES)
    assert set(FACTS) == set(PROFILES)


@pytest.mark.parametrize("profile", PROFILES)
def test_description_loads_with_its_gpus_memory_numa_fabric_and_mig(profile: str) -> None:
    count, memory, numa, links, mig_capable = FACTS[profile]
    node = from_profile(profile)
    assert len(node.gpus) == count
    assert len({g.uuid for g in node.gpus}) == count
    assert len({g.bus for g in node.gpus}) == count
    assert len({g.serial for g in node.gpus}) == count
    assert [g.minor for g in node.gpus] == list(range(count))
    for gpu in node.gpus:
        assert gpu.uuid.startswith("GPU-") and len(gpu.uuid) == 40, gpu.uuid
        assert gpu.bus.startswith("00000000:") and gpu.bus.endswith(":00.0"), gpu.bus
        assert gpu.memory == memory
        assert gpu.bridge.startswith("pci0000:") and gpu.bridge_numa >= 0
        assert gpu.links == [(NVLINK_SWITCH, NVSWITCH_BUS_ID)] * links
        assert gpu.mig_capable is mig_capable and not gpu.mig
        assert gpu.ecc
        assert gpu.pci_device_id & 0xFFFF == 0x10DE
    assert {g.bridge_numa for g in node.gpus} == numa
    assert (links > 0) == (profile in NVSWITCH_PROFILES)
    assert node.nvml.split(".")[1] == node.driver.split(".")[0]  # 12.550... for 550.x
    assert node.cuda >= 12000


@pytest.mark.parametrize(
    ("profile", "architecture", "capability"),
    [
        ("a100", "Ampere", 80),
        ("b200", "Blackwell", 100),
        ("gb200", "Blackwell", 100),
        ("gb300", "Blackwell", 100),
        ("h100", "Hopper", 90),
        ("l40s", "Ada Lovelace", 89),
        ("t4", "Turing", 75),
    ],
)
def test_gpus_have_their_models_architecture_and_compute_capability(
    profile: str, architecture: str, capability: int
) -> None:
    for gpu in from_profile(profile).gpus:
        assert (ARCHITECTURES[gpu.arch], gpu.cc) == (architecture, capability)


def test_h100_description_gives_the_gpus_the_suites_name() -> None:
    node = from_profile("h100")
    assert node.gpus[0].uuid == "GPU-01000100-0000-0000-0000-000000000000"
    assert node.gpus[0].name == "NVIDIA H100 80GB HBM3"
    assert [g.bridge for g in node.gpus] == ["pci0000:00"] * 4 + ["pci0000:80"] * 4
    assert (node.driver, node.cuda) == ("550.163.01", 12040)


def test_l40s_gpus_are_numbered_across_the_sockets_not_in_bus_order() -> None:
    buses = [g.bus for g in from_profile("l40s").gpus]
    assert buses != sorted(buses)


@pytest.mark.parametrize("layout", MIG_LAYOUTS)
def test_mig_layouts_fit_their_profiles(layout: str) -> None:
    node = with_mig(layout)
    assert any(g.migs for g in node.gpus)


def _broken(tmp_path: Path, old: str, new: str) -> Path:
    text = profile_path("t4").read_text()
    assert old in text
    path = tmp_path / "broken.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize(
    ("old", "new", "key"),
    [
        ("  memoryMiB: 16384\n", "", "model.memoryMiB: missing"),
        ("ecc: true\n", "ecc: true\n  clocks: 1590\n", "model.clocks: unknown key"),
        ("mig: none", "mig: maybe", "model.mig: 'maybe'"),
        ("architecture: Turing", "architecture: Tesla", "model.architecture: 'Tesla'"),
        ('root: "pci0000:00"', 'root: "pci0000:40"', "gpus[0].root: pci0000:40"),
        (', serial: "0421819085400"', "", "gpus[0].serial: missing"),
    ],
    ids=["missing-key", "unknown-key", "bad-mig", "bad-architecture", "unknown-root", "no-serial"],
)
def test_a_description_that_does_not_hold_is_refused_naming_file_and_key(
    tmp_path: Path, old: str, new: str, key: str
) -> None:
    path = _broken(tmp_path, old, new)
    with pytest.raises(ProfileError) as refused:
        load_profile(path)
    assert str(refused.value).startswith(f"{path}: {key}")
