"""The prepared-claims checkpoint: round trips, atomic writes, and corrupt files set aside."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from agents.core.device import DeviceNode
from agents.dra.claim_checkpoint import (
    CheckpointError,
    ClaimCheckpoint,
    PreparedClaim,
    PreparedDevice,
    _checksum,
    encode,
)
from agents.errors import AgentError
from tests.writers import file_size_limit

UID = "0b1e2f3a-4c5d-6e7f-8091-a2b3c4d5e6f7"
ENV_ID = f"k8s.gpu.nvidia.com/claim={UID}-env"
GPU0 = PreparedDevice(
    device="gpu-0",
    requests=("gpu", "gpus/big"),
    pool="node-1",
    cdi_ids=(f"k8s.gpu.nvidia.com/claim={UID}-gpu-0", ENV_ID),
    nodes=(
        DeviceNode("/dev/nvidia0", "/sim/dev/nvidia0", "r"),
        DeviceNode("/dev/nvidiactl", "/dev/nvidiactl"),
    ),
)
ADMIN = PreparedDevice("gpu-1", ("watch",), "node-1", (ENV_ID,), admin_access=True)
CLAIMS = {
    UID: PreparedClaim("ns-a", "claim-a", (GPU0, ADMIN), {"NVIDIA_VISIBLE_DEVICES": "GPU-a"}),
    "1111": PreparedClaim("ns-b", "claim-b", ()),
}


@pytest.fixture
def checkpoint(tmp_path: Path) -> ClaimCheckpoint:
    return ClaimCheckpoint(tmp_path / "gpu.nvidia.com" / "checkpoint.json")


def test_a_missing_file_is_an_empty_checkpoint(checkpoint: ClaimCheckpoint) -> None:
    assert checkpoint.load() == {}
    assert not checkpoint.corrupt_path.exists()


def test_saved_claims_load_back_equal(checkpoint: ClaimCheckpoint) -> None:
    checkpoint.save(CLAIMS)
    assert checkpoint.load() == CLAIMS
    assert stat.S_IMODE(checkpoint.path.stat().st_mode) == 0o600


def test_saving_again_replaces_the_claims(checkpoint: ClaimCheckpoint) -> None:
    checkpoint.save(CLAIMS)
    checkpoint.save({"1111": CLAIMS["1111"]})
    assert checkpoint.load() == {"1111": CLAIMS["1111"]}
    checkpoint.save({})
    assert checkpoint.load() == {}
    assert os.listdir(checkpoint.path.parent) == ["checkpoint.json"]


def test_the_file_is_versioned_json_with_a_checksum(checkpoint: ClaimCheckpoint) -> None:
    checkpoint.save(CLAIMS)
    document = json.loads(checkpoint.path.read_text())
    assert document["version"] == 1
    assert document["checksum"].startswith("sha256:")
    assert document["data"]["claims"][UID]["devices"][0]["cdiIDs"] == list(GPU0.cdi_ids)


def _corrupt_cases() -> dict[str, bytes]:
    good = encode(CLAIMS)
    document = json.loads(good)
    edited = json.loads(good)
    edited["data"]["claims"][UID]["namespace"] = "ns-x"
    newer = dict(document, version=2)
    wrong_type = json.loads(good)
    wrong_type["data"]["claims"][UID]["devices"][0]["requests"] = "gpu"
    # a consistent checksum over a wrongly typed field: the checksum alone cannot catch it
    wrong_type["checksum"] = _checksum(wrong_type["data"])
    return {
        "truncated": good[: len(good) // 2],
        "empty": b"",
        "not-utf8": b"\xff\xfe{}",
        "not-an-object": b"[1, 2]",
        "edited-contents": json.dumps(edited).encode(),
        "newer-version": json.dumps(newer).encode(),
        "no-checksum": json.dumps({"version": 1, "data": document["data"]}).encode(),
        "wrong-field-type": json.dumps(wrong_type).encode(),
    }


CORRUPT = _corrupt_cases()


@pytest.mark.parametrize("contents", CORRUPT.values(), ids=CORRUPT.keys())
def test_a_corrupt_file_is_a_checkpoint_error_and_is_kept_aside(
    checkpoint: ClaimCheckpoint, contents: bytes
) -> None:
    checkpoint.path.parent.mkdir()
    checkpoint.path.write_bytes(contents)
    with pytest.raises(CheckpointError) as caught:
        checkpoint.load()
    assert isinstance(caught.value, AgentError)
    assert caught.value.kept == checkpoint.corrupt_path
    assert str(checkpoint.path) in str(caught.value)
    assert checkpoint.corrupt_path.read_bytes() == contents
    assert not checkpoint.path.exists()
    assert checkpoint.load() == {}  # the next start begins afresh


def test_a_new_corrupt_file_replaces_the_one_kept_before(checkpoint: ClaimCheckpoint) -> None:
    checkpoint.path.parent.mkdir()
    for contents in (b"first", b"second"):
        checkpoint.path.write_bytes(contents)
        with pytest.raises(CheckpointError):
            checkpoint.load()
    assert checkpoint.corrupt_path.read_bytes() == b"second"


def test_an_unreadable_path_is_a_checkpoint_error_that_moves_nothing(
    checkpoint: ClaimCheckpoint,
) -> None:
    checkpoint.path.mkdir(parents=True)  # a directory where the file should be
    with pytest.raises(CheckpointError) as caught:
        checkpoint.load()
    assert caught.value.kept is None
    assert checkpoint.path.is_dir()


def test_a_save_failing_midway_leaves_the_old_checkpoint_whole(
    checkpoint: ClaimCheckpoint,
) -> None:
    checkpoint.save({"1111": CLAIMS["1111"]})
    size = checkpoint.path.stat().st_size
    many = {f"uid-{i}": CLAIMS[UID] for i in range(100)}
    with file_size_limit(size + 100), pytest.raises(OSError):
        checkpoint.save(many)
    assert checkpoint.load() == {"1111": CLAIMS["1111"]}
    assert os.listdir(checkpoint.path.parent) == ["checkpoint.json"]
