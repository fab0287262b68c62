"""The objects hack/scheduler_cost sends, built without a cluster: kubelet-less Nodes, one
copy per node of a ResourceSlice the agent published, the two claims measured (a share and
a whole GPU) with their pods, the claims that fill the cluster, and the figures' arithmetic."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

LABEL = "node-agents.io/scheduler-cost"  # on every object this tool creates
DRIVER = "gpu.nvidia.com"
CLASS = "gpu.nvidia.com"
IMAGE = "k8s.local/busybox:1.35"
SLICES = Path(__file__).resolve().parent / "slices"
SHARE = {"memory": "20Gi", "compute": "25"}
KINDS = ("share", "whole")
UNREACHABLE = "node.kubernetes.io/unreachable"
SHOWN = {"plain": "without sharing.shares", "shares": "with sharing.shares"}


class TemplateError(ValueError):
    """A slice template this tool cannot copy."""


def load_template(text: str, source: str) -> dict[str, Any]:
    """A ResourceSlice of the agent's GPU driver, as `kubectl get -o json` prints it, or as
    kept under slices/; only its devices matter. Shared counters are refused: none are
    published by the agent, and the figures are for slices without them."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise TemplateError(f"{source}: not JSON ({exc})") from exc
    spec = doc.get("spec") if isinstance(doc, dict) else None
    if not isinstance(spec, dict) or doc.get("kind") != "ResourceSlice":
        raise TemplateError(f"{source}: not a ResourceSlice")
    if spec.get("driver") != DRIVER:
        raise TemplateError(f"{source}: driver {spec.get('driver')!r}, not {DRIVER}")
    devices = spec.get("devices")
    if not isinstance(devices, list) or not devices:
        raise TemplateError(f"{source}: no devices")
    if spec.get("sharedCounters"):
        raise TemplateError(f"{source}: has sharedCounters; slices without them are measured")
    return {"driver": DRIVER, "devices": devices}


def shared(template: dict[str, Any]) -> bool:
    """Whether the template's GPUs are published for shares (sharing.shares)."""
    return any(d.get("allowMultipleAllocations") for d in template["devices"])


def node_name(index: int) -> str:
    return f"cost-{index:04d}"


def node_object(name: str) -> dict[str, Any]:
    """A Node with no kubelet, made as the node controller would leave it (every condition
    Unknown, unreachable): so that the controller has nothing to write about it while the
    scheduler is measured. Tainted so that only this tool's pods (which tolerate every
    taint) land on it."""
    conditions = [
        {"type": kind, "status": "Unknown", "reason": "NodeStatusNeverUpdated"}
        for kind in ("Ready", "MemoryPressure", "DiskPressure", "PIDPressure")
    ]
    base = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", LABEL: "true"},
        },
        "spec": {
            "taints": [
                {"key": LABEL, "value": "true", "effect": "NoSchedule"},
                {"key": UNREACHABLE, "effect": "NoSchedule"},
            ]
        },
        "status": {"capacity": base, "allocatable": base, "conditions": conditions},
    }


def node_slice(template: dict[str, Any], node: str) -> dict[str, Any]:
    """The template's devices, published for `node` as the agent names its slice."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu-nvidia-com-0", "labels": {LABEL: "true"}},
        "spec": {
            "driver": template["driver"],
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": copy.deepcopy(template["devices"]),
        },
    }


def claim(name: str, kind: str, count: int = 1) -> dict[str, Any]:
    """A share ({memory 20Gi, compute 25}), or whole GPUs (no capacity named)."""
    exactly: dict[str, Any] = {"deviceClassName": CLASS, "allocationMode": "ExactCount"}
    exactly["count"] = count
    if kind == "share":
        exactly["capacity"] = {"requests": dict(SHARE)}
    elif kind != "whole":
        raise ValueError(f"claim kind {kind!r}: one of {KINDS}")
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "labels": {LABEL: "true"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def pod(name: str, claim_name: str, role: str) -> dict[str, Any]:
    """A pod of the claim, for our nodes only; no kubelet will run it: it is only bound."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL: "true", "role": role}},
        "spec": {
            "nodeSelector": {LABEL: "true"},
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim_name}],
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def fill_count(nodes: int, full: float) -> int:
    """How many nodes to fill whole (one claim of every GPU each) for `full` of the GPUs."""
    if not 0 <= full < 1:
        raise ValueError(f"full {full}: a fraction in [0, 1)")
    return math.floor(nodes * full + 1e-9)


def check_room(nodes: int, full: float, template: dict[str, Any], samples: int) -> None:
    """Refuse a run whose samples (and warm-ups) could not all fit beside the fill."""
    gpus = len(template["devices"])
    free = (nodes - fill_count(nodes, full)) * gpus
    kinds = len(KINDS) if shared(template) else 1
    if free < kinds * (samples + 1):
        raise ValueError(f"{free} GPUs left free: too few for {samples} samples of each claim")


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest rank: the smallest value with at least p % of them at or below it."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values_ms: Sequence[float]) -> dict[str, float]:
    return {
        "samples": len(values_ms),
        "p50_ms": round(percentile(values_ms, 50), 1),
        "p99_ms": round(percentile(values_ms, 99), 1),
        "max_ms": round(max(values_ms), 1),
    }


def table(rows: Sequence[dict[str, Any]]) -> str:
    """Markdown: one row per slices x fullness x claim."""
    lines = [
        "| slices | GPUs full | claim | samples | p50 | p99 | max |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        shown = SHOWN.get(r["slices"], r["slices"])
        lines.append(
            f"| {shown} | {r['full_pct']} % | {r['claim']} | {r['samples']} "
            f"| {r['p50_ms']} ms | {r['p99_ms']} ms | {r['max_ms']} ms |"
        )
    return "\n".join(lines)
