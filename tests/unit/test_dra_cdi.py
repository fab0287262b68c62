"""The CDI spec files of prepared claims: names, contents, atomic writes, removal."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from agents.core.device import DeviceNode
from agents.dra.cdi import CdiDevice, CdiSpecs, cdi_ids
from tests.writers import file_size_limit

DRIVER = "gpu.nvidia.com"
UID = "0b1e2f3a-4c5d-6e7f-8091-a2b3c4d5e6f7"  # starts with a digit, as UIDs may
CTL = DeviceNode("/dev/nvidiactl", "/dev/nvidiactl")
GPU0 = CdiDevice("gpu-0", (DeviceNode("/dev/nvidia0", "/dev/nvidia0"), CTL))
GPU1 = CdiDevice("gpu-1", (DeviceNode("/dev/nvidia1", "/run/sim/dev/nvidia1", "r"), CTL))
ENV = {"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b", "EMPTY": ""}


def test_spec_file_is_named_after_driver_and_claim_and_has_cdi_version_and_kind(
    tmp_path: Path,
) -> None:
    specs = CdiSpecs(tmp_path / "cdi")  # created on the first write
    specs.write(DRIVER, UID, [GPU0], ENV)
    path = tmp_path / "cdi" / f"k8s.gpu.nvidia.com-claim_{UID}.yaml"
    document = yaml.safe_load(path.read_text())
    assert document["cdiVersion"] == "0.5.0"
    assert document["kind"] == "k8s.gpu.nvidia.com/claim"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


def test_each_device_gets_its_nodes_with_host_path_only_where_it_differs(tmp_path: Path) -> None:
    specs = CdiSpecs(tmp_path)
    specs.write(DRIVER, UID, [GPU0, GPU1], ENV)
    devices = yaml.safe_load(specs.path(DRIVER, UID).read_text())["devices"]
    by_name = {d["name"]: d["containerEdits"] for d in devices}
    assert by_name[f"{UID}-gpu-0"] == {
        "deviceNodes": [
            {"path": "/dev/nvidia0", "permissions": "rw"},
            {"path": "/dev/nvidiactl", "permissions": "rw"},
        ]
    }
    assert by_name[f"{UID}-gpu-1"]["deviceNodes"][0] == {
        "path": "/dev/nvidia1",
        "hostPath": "/run/sim/dev/nvidia1",
        "permissions": "r",
    }


def test_env_device_lists_the_claims_environment_as_key_value_strings(tmp_path: Path) -> None:
    specs = CdiSpecs(tmp_path)
    specs.write(DRIVER, UID, [GPU0, GPU1], ENV)
    devices = yaml.safe_load(specs.path(DRIVER, UID).read_text())["devices"]
    assert [d["name"] for d in devices] == [f"{UID}-gpu-0", f"{UID}-gpu-1", f"{UID}-env"]
    assert devices[-1]["containerEdits"] == {
        "env": ["NVIDIA_VISIBLE_DEVICES=GPU-a,GPU-b", "EMPTY="]
    }


def test_write_returns_each_devices_own_id_then_the_env_id(tmp_path: Path) -> None:
    ids = CdiSpecs(tmp_path).write(DRIVER, UID, [GPU0, GPU1], ENV)
    assert ids == {
        "gpu-0": (f"k8s.gpu.nvidia.com/claim={UID}-gpu-0", f"k8s.gpu.nvidia.com/claim={UID}-env"),
        "gpu-1": (f"k8s.gpu.nvidia.com/claim={UID}-gpu-1", f"k8s.gpu.nvidia.com/claim={UID}-env"),
    }


def test_no_device_is_written_without_edits_and_no_id_names_one(tmp_path: Path) -> None:
    # CDI refuses a whole spec holding a device without edits.
    bare = CdiDevice("nic-0000-3b-00-0", ())
    specs = CdiSpecs(tmp_path)
    ids = specs.write("roce.node-agents.io", UID, [bare], {})
    document = yaml.safe_load(specs.path("roce.node-agents.io", UID).read_text())
    assert document["devices"] == []
    assert ids == {"nic-0000-3b-00-0": ()}
    assert cdi_ids(DRIVER, UID, [GPU0], {}) == {"gpu-0": (f"k8s.gpu.nvidia.com/claim={UID}-gpu-0",)}


@pytest.mark.parametrize(
    ("claim_uid", "device"),
    [(UID, "gpu-"), (UID, "gpu/0"), (UID, "gpu 0"), (UID, "gpu=0"), ("-abc", "gpu-0")],
    ids=["trailing-dash", "slash", "space", "equals", "leading-dash"],
)
def test_a_name_cdi_would_refuse_is_an_error_before_anything_is_written(
    tmp_path: Path, claim_uid: str, device: str
) -> None:
    with pytest.raises(ValueError, match="not a valid CDI device name"):
        CdiSpecs(tmp_path).write(DRIVER, claim_uid, [CdiDevice(device, (CTL,))], {})
    assert list(tmp_path.iterdir()) == []


def test_rewriting_replaces_the_whole_spec(tmp_path: Path) -> None:
    specs = CdiSpecs(tmp_path)
    specs.write(DRIVER, UID, [GPU0, GPU1], ENV)
    specs.write(DRIVER, UID, [GPU1], {"A": "1"})
    devices = yaml.safe_load(specs.path(DRIVER, UID).read_text())["devices"]
    assert [d["name"] for d in devices] == [f"{UID}-gpu-1", f"{UID}-env"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [specs.path(DRIVER, UID).name]


def test_remove_is_idempotent(tmp_path: Path) -> None:
    specs = CdiSpecs(tmp_path)
    specs.write(DRIVER, UID, [GPU0], ENV)
    assert specs.remove(DRIVER, UID) is True
    assert not specs.path(DRIVER, UID).exists()
    assert specs.remove(DRIVER, UID) is False
    assert CdiSpecs(tmp_path / "never-made").remove(DRIVER, UID) is False


def test_written_lists_our_claim_specs_and_ignores_other_files(tmp_path: Path) -> None:
    specs = CdiSpecs(tmp_path)
    assert CdiSpecs(tmp_path / "absent").written() == []
    specs.write(DRIVER, UID, [GPU0], ENV)
    specs.write(DRIVER, "1111", [GPU1], ENV)
    specs.write("roce.node-agents.io", UID, [], {"NCCL_IB_HCA": "mlx5_0"})
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\n")
    (tmp_path / f".k8s.gpu.nvidia.com-claim_{UID}.yaml.x.tmp").write_text("")
    assert specs.written() == [
        (DRIVER, UID),
        (DRIVER, "1111"),
        ("roce.node-agents.io", UID),
    ]
    assert specs.written("roce.node-agents.io") == [("roce.node-agents.io", UID)]


def test_a_write_failing_midway_leaves_the_old_spec_and_no_partial_file(tmp_path: Path) -> None:
    specs = CdiSpecs(tmp_path)
    specs.write(DRIVER, UID, [GPU0], ENV)
    old = specs.path(DRIVER, UID).read_text()
    many = [CdiDevice(f"gpu-{i}", GPU0.nodes) for i in range(200)]
    with file_size_limit(len(old) + 100), pytest.raises(OSError):
        specs.write(DRIVER, UID, many, ENV)
    assert specs.path(DRIVER, UID).read_text() == old
    assert os.listdir(tmp_path) == [specs.path(DRIVER, UID).name]


def test_a_failed_rename_leaves_no_temporary_file(tmp_path: Path) -> None:
    specs = CdiSpecs(tmp_path)
    specs.path(DRIVER, UID).mkdir()  # something in the way that a rename cannot replace
    (specs.path(DRIVER, UID) / "x").write_text("")
    with pytest.raises(OSError):
        specs.write(DRIVER, UID, [GPU0], ENV)
    assert os.listdir(tmp_path) == [specs.path(DRIVER, UID).name]
