"""Reads a ResourceClaim for a prepare: one GET, within a deadline, the UID the kubelet
asked for, and what the scheduler allocated (results and opaque config) as plain values."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from agents.core.quantity import quantity
from agents.errors import AgentError

if TYPE_CHECKING:
    from agents.cluster.client import ApiClient

CLAIMS_PATH = "/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}"
NOT_FOUND = 404


class ClaimError(AgentError):
    """A claim that cannot be prepared as asked; the message names it and says why."""


class ClaimNotFoundError(ClaimError):
    pass


class ClaimUidMismatchError(ClaimError):
    """The claim of that name is another one than the kubelet's (deleted and made anew)."""


class ClaimNotAllocatedError(ClaimError):
    pass


class ClaimUnreadableError(ClaimError):
    """The API server did not answer in time, or answered with an error."""


@dataclass(frozen=True)
class AllocationResult:
    request: str
    driver: str
    pool: str
    device: str
    admin_access: bool = False
    share_id: str = ""  # one share of a device several claims hold at once; "" whole
    consumed: Mapping[str, str] = field(default_factory=dict)  # capacity -> quantity


@dataclass(frozen=True)
class OpaqueConfig:
    driver: str
    parameters: Any  # the JSON object the claim or its class gives
    requests: tuple[str, ...]  # the requests it applies to; empty: all of them
    source: str = ""  # FromClass or FromClaim


@dataclass(frozen=True)
class PodRef:
    """A pod the claim is reserved for (status.reservedFor), in the claim's namespace."""

    uid: str
    name: str


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str
    results: tuple[AllocationResult, ...]
    config: tuple[OpaqueConfig, ...]
    reserved_for: tuple[PodRef, ...] = ()  # the pods that use it now


async def get_claim(
    client: ApiClient, namespace: str, name: str, uid: str, deadline_s: float
) -> Claim:
    """The claim `namespace/name` with UID `uid`, allocated; ClaimError otherwise."""
    from agents.cluster.client import ApiError, UnreachableError  # DRA mode only

    what = f"ResourceClaim {namespace}/{name} (uid {uid})"
    path = CLAIMS_PATH.format(namespace=namespace, name=name)
    try:
        async with asyncio.timeout(deadline_s):
            obj = await client.request("GET", path)
    except TimeoutError as exc:
        raise ClaimUnreadableError(
            f"{what}: no answer from the API server in {deadline_s:g} s"
        ) from exc
    except UnreachableError as exc:
        raise ClaimUnreadableError(f"{what}: API server unreachable: {exc}") from exc
    except ApiError as exc:
        if exc.status == NOT_FOUND:
            raise ClaimNotFoundError(f"{what}: not found") from exc
        raise ClaimUnreadableError(f"{what}: {exc}") from exc
    return claim_of(obj, namespace, name, uid)


def claim_of(obj: dict[str, Any], namespace: str, name: str, uid: str) -> Claim:
    """A ResourceClaim's JSON read as a Claim, checked against the UID asked for."""
    what = f"ResourceClaim {namespace}/{name} (uid {uid})"
    found = str(_at(obj, "metadata", "uid") or "")
    if found != uid:
        raise ClaimUidMismatchError(f"{what}: the API server has uid {found or 'none'}")
    devices = _at(obj, "status", "allocation", "devices")
    if not isinstance(devices, dict):
        raise ClaimNotAllocatedError(f"{what}: not allocated (no status.allocation)")
    results = tuple(
        AllocationResult(
            str(r.get("request") or ""),
            str(r.get("driver") or ""),
            str(r.get("pool") or ""),
            str(r.get("device") or ""),
            r.get("adminAccess") is True,
            str(r.get("shareID") or ""),
            _quantities(r.get("consumedCapacity")),
        )
        for r in _dicts(devices.get("results"))
    )
    config = tuple(
        OpaqueConfig(
            str(c["opaque"].get("driver") or ""),
            c["opaque"].get("parameters"),
            tuple(str(r) for r in c.get("requests") or ()),
            str(c.get("source") or ""),
        )
        for c in _dicts(devices.get("config"))
        if isinstance(c.get("opaque"), dict)
    )
    pods = tuple(
        PodRef(str(r.get("uid") or ""), str(r.get("name") or ""))
        for r in _dicts(_at(obj, "status", "reservedFor"))
        if r.get("resource") == "pods" and not r.get("apiGroup")
    )
    return Claim(namespace, name, uid, results, config, pods)


def consumed(results: Sequence[AllocationResult]) -> dict[str, dict[str, str]]:
    """Per device that `results` hold shares of, what those shares consume together."""
    totals: dict[str, dict[str, Fraction | str]] = {}
    for result in results:
        if not result.share_id:
            continue
        device = totals.setdefault(result.device, {})
        for name, text in result.consumed.items():
            value, before = quantity(text), device.get(name)
            if before is None or not isinstance(value, Fraction):
                device[name] = value if before is None else text
            elif isinstance(before, Fraction):
                device[name] = before + value
    return {d: {k: _shown(v) for k, v in used.items()} for d, used in totals.items()}


def _shown(value: Fraction | str) -> str:
    if isinstance(value, str):
        return value
    return str(value.numerator) if value.denominator == 1 else str(float(value))


def _quantities(value: object) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def _at(obj: object, *keys: str) -> object:
    for key in keys:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _dicts(value: object) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []
