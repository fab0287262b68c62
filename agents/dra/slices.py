"""A driver's devices as `resource.k8s.io/v1` ResourceSlices of this node's pool: pure
functions from the family's model and device health to the JSON the API server stores,
and the comparison that says whether a stored slice already says the same."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from agents.core.health import Cause, DeviceHealth, Grade, Taint
from agents.core.quantity import quantity
from agents.kernel.facts import (
    HEALTH,
    AttributeValue,
    DeviceFacts,
    FamilyFacts,
    RequestPolicy,
    Version,
)

API_VERSION = "resource.k8s.io/v1"
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
MAX_DEVICES = 128  # per slice, as the API server allows
MAX_NAME = 253
NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"
MULTIPLE = "allowMultipleAllocations"  # a device several claims may hold at once

Obj = dict[str, Any]


def causes_of(devices: FamilyFacts, health: Iterable[DeviceHealth]) -> dict[str, Cause | None]:
    """Why each of `devices` (by name) is not Healthy, None where it is: the health its
    family tells of the resource device that serves it. The one place a DRA device's
    health is derived; the slices and DRAResourceHealth both read it."""
    causes = {(h.resource, h.device_id): h.cause for h in health}
    return {d.name: causes.get((d.resource, d.device_id)) for d in devices.devices}


def slice_name(node: str, driver: str, index: int) -> str:
    """`<node>-<driver, '.' as '-'>-<index>`: the same name for the same slice in every
    run, so that a create whose answer was lost is found (409) rather than doubled."""
    base, suffix = f"{node}-{driver.replace('.', '-')}", f"-{index}"
    if len(base) + len(suffix) > MAX_NAME:  # a node name near the limit
        digest = hashlib.sha256(base.encode()).hexdigest()[:8]
        base = f"{base[: MAX_NAME - len(suffix) - 9].rstrip('-.')}-{digest}"
    return base + suffix


def build_slices(
    node: str,
    node_uid: str,
    devices: FamilyFacts,
    causes: Mapping[str, Cause],
    *,
    taints: bool,
    generation: int,
    evict: bool = False,
) -> list[Obj]:
    """The slices of `devices`' pool on `node`, at most MAX_DEVICES devices each; `causes`:
    why each device (by name) that is not Healthy is so. Every device says its grade in
    the `node-agents.io/health` attribute. An Unhealthy device is left out, or with
    `taints` kept with its cause's taint: NoSchedule, or NoExecute with `evict`. With
    `taints` a Degraded device carries its signal's NoSchedule taint."""
    published = [
        _device(d, causes.get(d.name), devices.driver, taints=taints, evict=evict)
        for d in devices.devices
        if taints or not _unhealthy(causes.get(d.name))
    ]
    chunks = [published[i : i + MAX_DEVICES] for i in range(0, len(published), MAX_DEVICES)]
    chunks = chunks or [[]]  # an empty pool still says so: no devices here
    owner = {
        "apiVersion": "v1",
        "kind": "Node",
        "name": node,
        "uid": node_uid,
        "controller": True,
    }
    pool = {"name": node, "generation": generation, "resourceSliceCount": len(chunks)}
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {
                "name": slice_name(node, devices.driver, i),
                "ownerReferences": [owner],
            },
            "spec": {
                "driver": devices.driver,
                "nodeName": node,
                "pool": dict(pool),
                "devices": chunk,
            },
        }
        for i, chunk in enumerate(chunks)
    ]


def _unhealthy(cause: Cause | None) -> bool:
    return cause is not None and cause.grade is Grade.UNHEALTHY


def _device(
    device: DeviceFacts, cause: Cause | None, driver: str, *, taints: bool, evict: bool
) -> Obj:
    out: Obj = {"name": device.name}
    grade = Grade.HEALTHY if cause is None else cause.grade
    attributes = {**device.attributes, HEALTH: grade.value}
    out["attributes"] = {k: _attribute(v) for k, v in attributes.items()}
    if device.capacity:
        out["capacity"] = {
            k: _capacity(v, device.policies.get(k)) for k, v in device.capacity.items()
        }
    if device.shared:
        out[MULTIPLE] = True
    if taints and cause is not None:
        taint: Taint = cause.taint(driver)
        value = {"value": taint.value} if taint.value else {}
        effect = NO_EXECUTE if evict and grade is Grade.UNHEALTHY else NO_SCHEDULE
        out["taints"] = [{"key": taint.key, **value, "effect": effect}]
    return out


def _capacity(value: str, policy: RequestPolicy | None) -> Obj:
    if policy is None:
        return {"value": value}
    valid = {"min": policy.minimum, "max": policy.maximum, "step": policy.step}
    return {"value": value, "requestPolicy": {"default": policy.default, "validRange": valid}}


def _attribute(value: AttributeValue) -> Obj:
    if isinstance(value, bool):  # before int: a bool is an int to Python
        return {"bool": value}
    if isinstance(value, int):
        return {"int": value}
    if isinstance(value, Version):
        return {"version": value.value}
    return {"string": value}


def same_spec(stored: Obj, wanted: Obj) -> bool:
    """Whether a stored slice's spec says what `wanted`'s does, read as the API server
    writes it back: quantities in canonical form ("81920Mi" as "80Gi"), taints with the
    time it added them."""
    return _canonical(stored.get("spec")) == _canonical(wanted.get("spec"))


def _canonical(spec: object) -> object:
    if not isinstance(spec, dict):
        return spec
    out = dict(spec)
    out["devices"] = [
        _canonical_device(d) for d in spec.get("devices") or [] if isinstance(d, dict)
    ]
    return out


def _canonical_device(device: Obj) -> Obj:
    out = {k: v for k, v in device.items() if v not in ({}, [], None)}
    if "capacity" in out:
        out["capacity"] = {
            k: _quantities(v) if isinstance(v, dict) else v for k, v in out["capacity"].items()
        }
    if "taints" in out:
        out["taints"] = [
            {k: v for k, v in t.items() if k != "timeAdded" and v != ""}
            for t in out["taints"]
            if isinstance(t, dict)
        ]
    return out


def _quantities(capacity: Obj) -> Obj:
    """A capacity's value and request policy with every quantity as its exact number."""
    out: Obj = {**capacity, "value": quantity(str(capacity.get("value")))}
    policy = capacity.get("requestPolicy")
    if isinstance(policy, dict):
        out["requestPolicy"] = {
            k: _quantities_in(v) if isinstance(v, dict) else quantity(str(v))
            for k, v in policy.items()
        }
    return out


def _quantities_in(values: Obj) -> Obj:
    return {k: quantity(str(v)) for k, v in values.items()}
