"""The checks kube-apiserver v1.34 makes of a `resource.k8s.io/v1` ResourceSlice before
storing it, those that a node's driver can trip: names, limits per slice and per device,
attribute values and taints; a 422 Invalid Status naming each field, as it words it."""

from __future__ import annotations

import re
from typing import Any

GROUP = "resource.k8s.io"
API_VERSION = f"{GROUP}/v1"
MAX_DEVICES = 128
MAX_ATTRIBUTES_AND_CAPACITIES = 32
MAX_STRING = 64
MAX_TAINTS = 4
MAX_DRIVER = 63
MAX_ID = 32
TAINT_EFFECTS = ("NoExecute", "NoSchedule")

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
C_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NUM = r"(0|[1-9]\d*)"
_PRE = r"(0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)"
SEMVER = re.compile(
    rf"^{_NUM}\.{_NUM}\.{_NUM}(-{_PRE}(\.{_PRE})*)?(\+[0-9a-zA-Z-]+(\.[0-9a-zA-Z-]+)*)?$"
)
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")
VALUE_KINDS = ("bool", "int", "string", "version")

Errors = list[tuple[str, str]]  # (field, message)


def slice_errors(obj: Any, old: Any = None) -> Errors:
    """What the API server finds wrong in `obj` (an update of `old`, if given)."""
    errors: Errors = []
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    _name(meta, errors)
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        for key in ("apiVersion", "kind", "name", "uid"):
            if not ref.get(key):
                errors.append((f"metadata.ownerReferences[{i}].{key}", "Required value"))
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    _spec(spec, errors)
    if old is not None:
        for path in (("driver",), ("nodeName",), ("pool", "name")):
            if _get(spec, path) != _get(old["spec"], path):
                errors.append((f"spec.{'.'.join(path)}", "field is immutable"))
    return errors


def invalid_message(name: str, errors: Errors) -> tuple[str, dict[str, Any]]:
    """The message and details of the 422 Status for `errors`."""
    text = ", ".join(f"{f}: {m}" for f, m in errors)
    causes = [{"reason": "FieldValueInvalid", "message": m, "field": f} for f, m in errors]
    details = {"name": name, "group": GROUP, "kind": "ResourceSlice", "causes": causes}
    return f'ResourceSlice.{GROUP} "{name}" is invalid: [{text}]', details


def _get(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        obj = obj.get(key) if isinstance(obj, dict) else None
    return obj


def _name(meta: dict[str, Any], errors: Errors) -> None:
    name = meta.get("name") or ""
    if not name and not meta.get("generateName"):
        errors.append(("metadata.name", "Required value: name or generateName is required"))
    elif name and (len(name) > 253 or not DNS_SUBDOMAIN.match(name)):
        errors.append(("metadata.name", f'Invalid value: "{name}": a lowercase RFC 1123 subdomain'))


def _spec(spec: dict[str, Any], errors: Errors) -> None:
    driver = spec.get("driver") or ""
    if not driver:
        errors.append(("spec.driver", "Required value"))
    elif len(driver) > MAX_DRIVER or not DNS_SUBDOMAIN.match(driver):
        errors.append(("spec.driver", f'Invalid value: "{driver}": a DNS subdomain of <= 63'))
    pool = spec.get("pool") or {}
    pool_name = pool.get("name") or ""
    if not pool_name or any(not DNS_SUBDOMAIN.match(p) for p in pool_name.split("/")):
        errors.append(("spec.pool.name", f'Invalid value: "{pool_name}"'))
    if not isinstance(pool.get("resourceSliceCount"), int) or pool["resourceSliceCount"] <= 0:
        errors.append(("spec.pool.resourceSliceCount", "must be greater than zero"))
    if not isinstance(pool.get("generation", 0), int) or pool.get("generation", 0) < 0:
        errors.append(("spec.pool.generation", "must be greater than or equal to zero"))
    chosen = [
        k for k in ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection") if spec.get(k)
    ]
    if len(chosen) != 1:
        errors.append(
            (
                "spec",
                "exactly one of `nodeName`, `nodeSelector`, `allNodes`, "
                "`perDeviceNodeSelection` is required",
            )
        )
    devices = spec.get("devices") or []
    if len(devices) > MAX_DEVICES:
        errors.append(
            ("spec.devices", f"Too many: {len(devices)}: must have at most {MAX_DEVICES} items")
        )
    seen: set[str] = set()
    for i, device in enumerate(devices):
        name = device.get("name") or ""
        if name in seen:
            errors.append((f"spec.devices[{i}].name", f'Duplicate value: "{name}"'))
        seen.add(name)
        _device(device, f"spec.devices[{i}]", errors)


def _device(device: dict[str, Any], at: str, errors: Errors) -> None:
    name = device.get("name") or ""
    if len(name) > 63 or not DNS_LABEL.match(name):
        errors.append((f"{at}.name", f'Invalid value: "{name}": a lowercase RFC 1123 label'))
    attributes = device.get("attributes") or {}
    capacity = device.get("capacity") or {}
    if len(attributes) + len(capacity) > MAX_ATTRIBUTES_AND_CAPACITIES:
        errors.append(
            (
                at,
                "the total number of attributes and capacities must not exceed "
                f"{MAX_ATTRIBUTES_AND_CAPACITIES}",
            )
        )
    for key, value in attributes.items():
        _qualified(key, f"{at}.attributes[{key}]", errors)
        _attribute(value, f"{at}.attributes[{key}]", errors)
    for key, value in capacity.items():
        _qualified(key, f"{at}.capacity[{key}]", errors)
        if not isinstance(value, dict) or not QUANTITY.match(str(value.get("value", ""))):
            errors.append((f"{at}.capacity[{key}].value", "Invalid value: a quantity"))
    taints = device.get("taints") or []
    if len(taints) > MAX_TAINTS:
        errors.append(
            (f"{at}.taints", f"Too many: {len(taints)}: must have at most {MAX_TAINTS} items")
        )
    for i, taint in enumerate(taints):
        _taint(taint, f"{at}.taints[{i}]", errors)


def _qualified(key: str, at: str, errors: Errors) -> None:
    domain, _, ident = key.rpartition("/")
    if "/" in key and (not domain or len(domain) > MAX_DRIVER or not DNS_SUBDOMAIN.match(domain)):
        errors.append((at, f'Invalid value: "{key}": the domain'))
    if len(ident) > MAX_ID or not C_IDENTIFIER.match(ident):
        errors.append((at, f'Invalid value: "{key}": a C identifier of <= {MAX_ID}'))


def _attribute(value: Any, at: str, errors: Errors) -> None:
    kinds = [k for k in VALUE_KINDS if isinstance(value, dict) and k in value]
    if len(kinds) != 1:
        errors.append((at, "exactly one value must be specified"))
        return
    kind, v = kinds[0], value[kinds[0]]
    if kind in ("string", "version") and len(str(v)) > MAX_STRING:
        errors.append((f"{at}.{kind}", f"Too long: may not be more than {MAX_STRING} bytes"))
    if kind == "version" and not SEMVER.match(str(v)):
        errors.append((f"{at}.version", "must be a string compatible with semver.org spec 2.0.0"))
    types = {"bool": bool, "int": int, "string": str, "version": str}
    if not isinstance(v, types[kind]) or (kind == "int" and isinstance(v, bool)):
        errors.append((f"{at}.{kind}", f"Invalid value: not a {kind}"))


def _taint(taint: dict[str, Any], at: str, errors: Errors) -> None:
    key = str(taint.get("key") or "")
    prefix, _, name = key.rpartition("/")
    if (
        not LABEL_NAME.match(name)
        or len(name) > 63
        or ("/" in key and not DNS_SUBDOMAIN.match(prefix))
    ):
        errors.append((f"{at}.key", f'Invalid value: "{key}": a qualified name'))
    value = str(taint.get("value") or "")
    if len(value) > 63 or not LABEL_VALUE.match(value):
        errors.append((f"{at}.value", f'Invalid value: "{value}": a label value'))
    effect = taint.get("effect")
    if effect not in TAINT_EFFECTS:
        errors.append(
            (f"{at}.effect", f'Unsupported value: "{effect}": {", ".join(TAINT_EFFECTS)}')
        )
