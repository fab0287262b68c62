"""A ResourceClaim's JSON read for a prepare: the UID asked for, the allocation's results
and opaque config, and a clear error for a claim of another UID or not allocated."""

from __future__ import annotations

from typing import Any

import pytest

from agents.dra.claims import (
    AllocationResult,
    ClaimError,
    ClaimNotAllocatedError,
    ClaimUidMismatchError,
    OpaqueConfig,
    PodRef,
    claim_of,
)

RESULT = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-0"}
SHARING = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}


def _claim(uid: str = "u1", status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "c", "namespace": "ns", "uid": uid}, "status": status or {}}


def test_results_and_opaque_config_are_read() -> None:
    devices = {
        "results": [RESULT, {**RESULT, "request": "watch", "device": "gpu-1", "adminAccess": True}],
        "config": [
            {
                "source": "FromClaim",
                "requests": ["gpu"],
                "opaque": {"driver": "gpu.nvidia.com", "parameters": SHARING},
            },
            {"source": "FromClass", "requests": []},  # no opaque part: not ours to read
        ],
    }
    claim = claim_of(_claim(status={"allocation": {"devices": devices}}), "ns", "c", "u1")
    assert claim.results == (
        AllocationResult("gpu", "gpu.nvidia.com", "node-1", "gpu-0", False),
        AllocationResult("watch", "gpu.nvidia.com", "node-1", "gpu-1", True),
    )
    assert claim.config == (OpaqueConfig("gpu.nvidia.com", SHARING, ("gpu",), "FromClaim"),)


def test_the_pods_a_claim_is_reserved_for_are_read_and_other_consumers_left_out() -> None:
    reserved = [
        {"resource": "pods", "name": "p1", "uid": "uid-1"},
        {"apiGroup": "example.com", "resource": "pods", "name": "x", "uid": "uid-x"},
        {"resource": "pods", "name": "p2", "uid": "uid-2"},
        "not a reference",
    ]
    status = {"allocation": {"devices": {"results": [RESULT]}}, "reservedFor": reserved}
    claim = claim_of(_claim(status=status), "ns", "c", "u1")
    assert claim.reserved_for == (PodRef("uid-1", "p1"), PodRef("uid-2", "p2"))
    unreserved = claim_of(_claim(status={"allocation": {"devices": {}}}), "ns", "c", "u1")
    assert unreserved.reserved_for == ()


@pytest.mark.parametrize(
    ("obj", "error", "words"),
    [
        (_claim("u2"), ClaimUidMismatchError, "the API server has uid u2"),
        (_claim(status={}), ClaimNotAllocatedError, "not allocated"),
        (_claim(status={"allocation": {}}), ClaimNotAllocatedError, "not allocated"),
    ],
    ids=["other-uid", "no-allocation", "no-devices"],
)
def test_a_claim_that_cannot_be_prepared_says_why(
    obj: dict[str, Any], error: type[ClaimError], words: str
) -> None:
    with pytest.raises(error) as err:
        claim_of(obj, "ns", "c", "u1")
    assert "ResourceClaim ns/c (uid u1)" in str(err.value)
    assert words in str(err.value)
