"""The seeded workload: which pod to create or delete next, and the claims and pods each
mode sends for one request shape. The sequence depends only on the seed and on what the
workload itself asked for, never on placement, so every mode gets the same one."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from hack.clusterlib.layouts import GPU_DRIVER, NIC_DRIVER

SWITCH = "node-agents.io/pcieSwitch"
ROOT = "resource.kubernetes.io/pcieRoot"
GPU_RESOURCE, NIC_RESOURCE = "nvidia.com/gpu", "rdma/roce"
SIZES = (1, 2, 4)
PRESSURE = 6  # 0.5 ** (1 / 6): half the operations delete at 89 % of the GPUs asked for
PAIRED_SHARE = 0.75  # of creations; the rest ask for GPUs only
LABEL = "node-agents.io/cluster-sim"  # on our nodes, pods and everything else we create
IMAGE = "k8s.local/busybox:1.35"


@dataclass(frozen=True)
class Shape:
    """What one pod asks for: `size` GPU/NIC pairs, or `size` GPUs alone."""

    paired: bool
    size: int

    @property
    def name(self) -> str:
        return f"{'pairs' if self.paired else 'gpus'}-{self.size}"

    @property
    def gpus(self) -> int:
        return self.size


SHAPES = tuple(Shape(paired, size) for paired in (True, False) for size in SIZES)


@dataclass(frozen=True)
class Create:
    shape: Shape


@dataclass(frozen=True)
class Delete:
    index: int  # into the live pods, oldest first


Op = Create | Delete


class Workload:
    """Creations and deletions at random: a pod is deleted with the probability of the share
    of the cluster's GPUs that live pods (placed or pending) ask for, to the power PRESSURE,
    so the cluster hovers around 90 % asked for: busy enough to fragment and make pods wait."""

    def __init__(self, seed: int, total_gpus: int) -> None:
        self.rng = random.Random(seed)
        self.total_gpus = total_gpus
        self.live: list[Shape] = []

    def next(self) -> Op:
        asked = sum(s.gpus for s in self.live)
        if self.live and self.rng.random() < min(1.0, asked / self.total_gpus) ** PRESSURE:
            index = self.rng.randrange(len(self.live))
            del self.live[index]
            return Delete(index)
        paired = self.rng.random() < PAIRED_SHARE
        shape = Shape(paired, self.rng.choice(SIZES))
        self.live.append(shape)
        return Create(shape)


def claim_template(
    name: str, shape: Shape, attribute: str, classes: tuple[str, str]
) -> dict[str, Any]:
    """A ResourceClaimTemplate for a shape: one GPU request and one NIC request per pair,
    each pair constrained to one value of `attribute`; GPUs alone without constraints."""
    gpu_class, nic_class = classes
    requests: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    for i in range(shape.size):
        requests.append({"name": f"gpu-{i}", "exactly": {"deviceClassName": gpu_class}})
        if shape.paired:
            requests.append({"name": f"nic-{i}", "exactly": {"deviceClassName": nic_class}})
            constraints.append({"requests": [f"gpu-{i}", f"nic-{i}"], "matchAttribute": attribute})
    spec: dict[str, Any] = {"devices": {"requests": requests}}
    if constraints:
        spec["devices"]["constraints"] = constraints
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "labels": {LABEL: "true"}},
        "spec": {"spec": spec},
    }


def device_classes(prefix: str) -> list[dict[str, Any]]:
    """Our own DeviceClasses (the cluster may have others of the same drivers): whole GPUs
    of the GPU driver, and the NICs."""
    gpu = f"device.driver == '{GPU_DRIVER}' && device.attributes['{GPU_DRIVER}'].type == 'gpu'"
    nic = f"device.driver == '{NIC_DRIVER}'"
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": f"{prefix}-{what}", "labels": {LABEL: "true"}},
            "spec": {"selectors": [{"cel": {"expression": expression}}]},
        }
        for what, expression in (("gpu", gpu), ("nic", nic))
    ]


def pod(name: str, shape: Shape, template: str | None) -> dict[str, Any]:
    """A pod of one container: its claim from a ResourceClaimTemplate, or (None) the
    device plugins' counts in its limits."""
    container: dict[str, Any] = {
        "name": "main",
        "image": IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sleep", "3600"],
    }
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "terminationGracePeriodSeconds": 0,
        "nodeSelector": {LABEL: "true"},
        "tolerations": [{"key": LABEL, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
    }
    if template is not None:
        spec["resourceClaims"] = [{"name": "devices", "resourceClaimTemplateName": template}]
        container["resources"] = {"claims": [{"name": "devices"}]}
    else:
        limits = {GPU_RESOURCE: str(shape.size)}
        if shape.paired:
            limits[NIC_RESOURCE] = str(shape.size)
        container["resources"] = {"limits": limits}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL: "true", "shape": shape.name}},
        "spec": spec,
    }
