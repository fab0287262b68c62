"""GPUs and MIG instances as the DRA driver gpu.nvidia.com publishes them: names,
attributes and capacities that claims and CEL selectors written for that driver expect."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

from agents.config_shares import Shares
from agents.core.gfd_facts import Fabric
from agents.core.health import OURS
from agents.gpu.discovery import DriverVersions, Gpu
from agents.gpu.plan import Unit
from agents.hw.nvml import MigInstance
from agents.kernel.facts import (
    AttributeValue,
    DeviceFacts,
    RequestPolicy,
    Version,
    pci_attributes,
)

DRIVER = "gpu.nvidia.com"
GPU_TYPE = "gpu"
MIG_TYPE = "mig"
CLUSTER_UUID = f"{OURS}/clusterUUID"
CLIQUE_ID = f"{OURS}/cliqueID"
_BINARY = ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
MEMORY, COMPUTE = "memory", "compute"  # a shared GPU's capacities: bytes, % of its SMs
COMPUTE_PERCENT = 100


def semantic(version: str) -> Version | None:
    """A dotted version as a semantic version: numbers only, leading zeros dropped, missing
    parts 0 ("550.163.01" -> 550.163.1, "12.4" -> 12.4.0); None for anything else."""
    parts = version.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    numbers = [int(p) for p in parts] + [0] * (3 - len(parts))
    return Version(".".join(str(n) for n in numbers))


def binary_quantity(count: int) -> str:
    """A count (of bytes, or of anything) as a Kubernetes quantity in its canonical binary
    form: 42949672960 -> "40Gi", 1 -> "1"."""
    suffix = ""
    for name in _BINARY:
        if count == 0 or count % 1024:
            break
        count //= 1024
        suffix = name
    return f"{count}{suffix}"


def gpu_attributes(gpu: Gpu, driver: DriverVersions) -> dict[str, AttributeValue]:
    """What a whole GPU and each of its MIG instances share: product, brand, architecture,
    versions and where it sits; a fact NVML did not give is left out."""
    attributes: dict[str, AttributeValue] = {}
    for name, value in (
        ("productName", gpu.model),
        ("brand", gpu.brand),
        ("architecture", gpu.architecture),
    ):
        if value:
            attributes[name] = value
    for name, text in (
        ("cudaComputeCapability", gpu.compute_capability),
        ("driverVersion", driver.version),
        ("cudaDriverVersion", driver.cuda_version),
    ):
        if (version := semantic(text)) is not None:
            attributes[name] = version
    attributes.update(pci_attributes(gpu.pci, gpu.location, gpu.numa))
    return attributes


def whole_gpu(
    gpu: Gpu,
    resource: str,
    driver: DriverVersions,
    fabric: Fabric | None = None,
    shares: Shares | None = None,
) -> DeviceFacts:
    """A whole GPU; with `shares`, allocated in shares of its memory and SMs."""
    capacity = {"memory": binary_quantity(gpu.memory_mib * 2**20)} if gpu.memory_mib else {}
    attributes: dict[str, AttributeValue] = {"type": GPU_TYPE, "uuid": gpu.uuid}
    attributes.update(gpu_attributes(gpu, driver))
    if fabric is not None and fabric.attached:  # its NVLink domain, for claims to match
        attributes[CLUSTER_UUID] = fabric.cluster_uuid
        attributes[CLIQUE_ID] = str(fabric.clique_id)
    device = DeviceFacts(f"gpu-{gpu.minor}", resource, gpu.uuid, attributes, capacity)
    policies = share_policies(gpu.memory_mib * 2**20, shares) if shares is not None else {}
    if not policies:
        return device
    capacity = {**capacity, COMPUTE: str(COMPUTE_PERCENT)}
    return dataclasses.replace(device, capacity=capacity, shared=True, policies=policies)


def share_policies(memory: int, shares: Shares) -> dict[str, RequestPolicy]:
    """What a share consumes of a GPU with `memory` bytes: memory in steps, by default all
    of it on the step grid (the API server refuses a default or max off the grid), and
    none of its SMs unless asked; none where the memory is below one step."""
    step = shares.memory_step
    most = memory // step * step
    if most < step:
        return {}
    on_grid = binary_quantity(most)
    return {
        MEMORY: RequestPolicy(on_grid, binary_quantity(step), on_grid, binary_quantity(step)),
        COMPUTE: RequestPolicy("0", "0", str(COMPUTE_PERCENT), "1"),
    }


def mig_name(parent_minor: int, mig: MigInstance) -> str:
    """gpu-<parent minor>-mig-<profile without '.', '+' as '-'>-<GI profile ID>-<start>."""
    profile = re.sub(r"[^a-z0-9-]", "-", mig.profile.lower().replace(".", "")).strip("-")
    return f"gpu-{parent_minor}-mig-{profile}-{mig.gi_profile_id}-{mig.placement_start}"


def mig_device(gpu: Gpu, mig: MigInstance, resource: str, driver: DriverVersions) -> DeviceFacts:
    attributes: dict[str, AttributeValue] = {
        "type": MIG_TYPE,
        "uuid": mig.uuid,
        "parentUUID": gpu.uuid,
        "profile": mig.profile,
    }
    attributes.update(gpu_attributes(gpu, driver))
    engines = mig.engines
    capacity = {
        "multiprocessors": str(engines.multiprocessors),
        "copyEngines": str(engines.copy_engines),
        "decoders": str(engines.decoders),
        "encoders": str(engines.encoders),
        "jpegEngines": str(engines.jpeg_engines),
        "ofaEngines": str(engines.ofa_engines),
        "memory": binary_quantity(engines.memory_mib * 2**20),
    }
    for memory_slice in range(mig.placement_start, mig.placement_start + mig.placement_size):
        capacity[f"memorySlice{memory_slice}"] = "1"
    return DeviceFacts(mig_name(gpu.minor, mig), resource, mig.uuid, attributes, capacity)


def devices(
    gpus: Iterable[Gpu],
    served: Iterable[tuple[str, Unit]],
    driver: DriverVersions,
    fabrics: Mapping[str, Fabric | None] | None = None,
    shares: Shares | None = None,
) -> tuple[DeviceFacts, ...]:
    """The device of each served unit (resource name, unit): a whole GPU, or a MIG
    instance; a replica's GPU or instance once, under the first resource that serves it.
    A whole GPU attached to an NVLink fabric carries its cluster UUID and clique ID; with
    `shares` each whole GPU is shared (MIG instances never are)."""
    by_uuid: Mapping[str, Gpu] = {g.uuid: g for g in gpus}
    out: dict[str, DeviceFacts] = {}
    for resource, unit in served:
        gpu = by_uuid.get(unit.gpu_uuid)
        if gpu is None or unit.visible_id in out:
            continue
        if unit.visible_id == gpu.uuid:
            fabric = (fabrics or {}).get(gpu.uuid)
            out[unit.visible_id] = whole_gpu(gpu, resource, driver, fabric, shares)
            continue
        mig = next((m for m in gpu.mig if m.uuid == unit.visible_id), None)
        if mig is not None:
            out[unit.visible_id] = mig_device(gpu, mig, resource, driver)
    return tuple(out.values())


SHARING_KINDS = ("GpuConfig", "MigDeviceConfig")


def accepts(parameters: Mapping[str, object]) -> str | None:
    """An opaque claim config of this driver: a GPU or MIG device config that asks for
    time-slicing (or for no sharing at all) is taken, as claims share devices by claim
    anyway; any other kind or strategy is refused (None: taken)."""
    kind = parameters.get("kind")
    if kind not in SHARING_KINDS:
        return f"kind {kind!r} is not one of {', '.join(SHARING_KINDS)}"
    sharing = parameters.get("sharing")
    strategy = sharing.get("strategy") if isinstance(sharing, Mapping) else "TimeSlicing"
    if sharing is not None and strategy != "TimeSlicing":
        return f"sharing strategy {strategy!r}: only TimeSlicing is served"
    return None
