"""Reading a claim for a prepare against the API-server stand-in over real HTTP: exactly
one GET, not found, and an API server that does not answer within the deadline."""

from __future__ import annotations

import time

import pytest

from agents.cluster.client import ApiClient
from agents.dra.claims import (
    AllocationResult,
    ClaimNotFoundError,
    ClaimUnreadableError,
    get_claim,
)
from tests.standin.apiserver import HANG, ApiServer

RESULT = {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-1", "device": "gpu-3"}


async def test_a_claim_is_read_with_one_get(server: ApiServer, client: ApiClient) -> None:
    server.store.put_claim("ns", "c", "u1", [RESULT])
    claim = await get_claim(client, "ns", "c", "u1", deadline_s=5.0)
    assert claim.results == (AllocationResult("gpu", "gpu.nvidia.com", "node-1", "gpu-3"),)
    assert [(c.verb, c.resource) for c in server.calls] == [("get", "resourceclaims")]


async def test_a_missing_claim_is_not_found(client: ApiClient) -> None:
    with pytest.raises(ClaimNotFoundError, match=r"ResourceClaim ns/gone .* not found"):
        await get_claim(client, "ns", "gone", "u1", deadline_s=5.0)


async def test_no_answer_within_the_deadline_is_a_timeout(
    server: ApiServer, client: ApiClient
) -> None:
    server.store.put_claim("ns", "c", "u1", [RESULT])
    await server.set_mode(HANG)
    started = time.monotonic()
    with pytest.raises(ClaimUnreadableError, match=r"no answer from the API server in 0\.3 s"):
        await get_claim(client, "ns", "c", "u1", deadline_s=0.3)
    assert time.monotonic() - started < 2.0
