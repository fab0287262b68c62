"""The nodes the tests give the project's test NVML library: built from a GPU node
description of tests/nvml/profiles (the format: docs/testing.md) or from a simulated node
file, and the MIG layouts the suites use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from agents.core.fabric_health import HEALTHY_MASK
from agents.core.gfd_facts import Fabric
from agents.hw.nvml import ARCHITECTURES
from agents.sim.nvml import mig_capable, model, placed, reading
from agents.sim.specs import GpuSpec, NodeSpec
from tests.nvml.state import (
    ERRORS,
    NVLINK_GPU,
    NVLINK_SWITCH,
    NVSWITCH_BUS_ID,
    Gpu,
    NvmlNode,
    Process,
    Signals,
    nvml_bus_id,
)

REPO = Path(__file__).resolve().parents[2]  # the repository's root
PROFILE_DIR = Path(__file__).with_name("profiles")
PROFILES = ("a100", "b200", "gb200", "gb300", "h100", "l40s", "t4")
_MODEL_KEYS = {"name", "pci", "architecture", "computeCapability", "memoryMiB", "ecc", "mig"}
_OPTIONAL_MODEL_KEYS = {"pcie"}  # {gen, width}: the link it trains at; default Gen5 x16
_NO_ROW_REMAPPING = ("Turing",)  # row remapping came with Ampere, and replaced page
# retirement: NVML answers NOT_SUPPORTED for pages pending retirement from Ampere on (an
# H200 on driver 580 does so)
_TOP_KEYS = {"driver", "nvml", "cuda", "model", "nvswitchLinks", "rootComplexes", "gpus"}
_OPTIONAL_TOP_KEYS = {"fabric"}  # {clusterUuid, cliqueId}: every GPU registered with it
_GPU_KEYS = {"bus", "root", "uuid", "serial"}
_MIG = ("none", "capable", "enabled")


class ProfileError(ValueError):
    """A node description that does not hold: names the file and the key."""


def profile_path(profile: str) -> Path:
    return PROFILE_DIR / f"{profile}.yaml"


def from_profile(profile: str) -> NvmlNode:
    """The node of tests/nvml/profiles/<profile>.yaml."""
    return load_profile(profile_path(profile))


def load_profile(path: Path) -> NvmlNode:
    """The node a GPU node description gives: its GPUs, PCI addresses, memory, ECC, MIG
    mode, root complexes and NUMA nodes, and NVSwitch fabric (every NVLink of a GPU to
    a switch where the description has them; none otherwise). ProfileError, naming the
    file and the key, for a description that does not hold."""
    doc = _mapping(yaml.safe_load(path.read_text()), _TOP_KEYS, path, "", _OPTIONAL_TOP_KEYS)
    spec = _mapping(doc["model"], _MODEL_KEYS, path, "model.", _OPTIONAL_MODEL_KEYS)
    roots = {str(r): int(numa) for r, numa in dict(doc["rootComplexes"]).items()}
    links = [(NVLINK_SWITCH, NVSWITCH_BUS_ID)] * int(doc["nvswitchLinks"])
    gpus = []
    for index, entry in enumerate(doc["gpus"]):
        gpu = _mapping(entry, _GPU_KEYS, path, f"gpus[{index}].")
        if gpu["root"] not in roots:
            raise ProfileError(f"{path}: gpus[{index}].root: {gpu['root']} is not in rootComplexes")
        gpus.append(_gpu(spec, gpu, index, links, f"{path}: "))
        gpus[-1].bridge, gpus[-1].bridge_numa = str(gpu["root"]), roots[str(gpu["root"])]
        gpus[-1].fabric = _profile_fabric(doc.get("fabric"), path)
    major, minor = str(doc["cuda"]).split(".")
    return NvmlNode(
        gpus=gpus,
        driver=str(doc["driver"]),
        nvml=str(doc["nvml"]),
        cuda=int(major) * 1000 + int(minor) * 10,
    )


def _gpu(
    spec: dict[str, Any], gpu: dict[str, Any], index: int, links: list[tuple[int, str]], at: str
) -> Gpu:
    vendor, device = str(spec["pci"]).split(":")
    major, minor = str(spec["computeCapability"]).split(".")
    if spec["mig"] not in _MIG:
        raise ProfileError(f"{at}model.mig: {spec['mig']!r} is not one of {', '.join(_MIG)}")
    if spec["architecture"] not in ARCHITECTURES.values():
        raise ProfileError(f"{at}model.architecture: {spec['architecture']!r} is not NVML's")
    return Gpu(
        uuid=str(gpu["uuid"]),
        name=str(spec["name"]),
        bus=nvml_bus_id(str(gpu["bus"])),
        memory=int(spec["memoryMiB"]) * 2**20,
        minor=index,
        pci_device_id=int(device, 16) << 16 | int(vendor, 16),
        serial=str(gpu["serial"]),
        arch=next(n for n, name in ARCHITECTURES.items() if name == spec["architecture"]),
        cc=int(major) * 10 + int(minor),
        mig_capable=spec["mig"] != "none",
        mig=spec["mig"] == "enabled",
        ecc=bool(spec["ecc"]),
        links=list(links),
        signals=_profile_signals(spec, at),
    )


def _profile_fabric(value: object, path: Path) -> Fabric | None:
    """The fabric every GPU of the profile registered with, completed, successful and
    healthy (as NVIDIA's mock NVML answers)."""
    if value is None:
        return None
    fabric = _mapping(value, {"clusterUuid", "cliqueId"}, path, "fabric.")
    return Fabric(
        str(fabric["clusterUuid"]), int(fabric["cliqueId"]), 3, 0, health_mask=HEALTHY_MASK
    )


def _profile_signals(spec: dict[str, Any], at: str) -> Signals:
    pcie = _mapping(spec.get("pcie", {"gen": 5, "width": 16}), {"gen", "width"}, Path(at), "pcie.")
    gen, width = int(pcie["gen"]), int(pcie["width"])
    return Signals(
        pcie_width=width,
        pcie_max_width=width,
        pcie_gen=gen,
        pcie_max_gen=gen,
        remap=spec["architecture"] not in _NO_ROW_REMAPPING,
        retired=spec["architecture"] in _NO_ROW_REMAPPING,
    )


def _mapping(
    value: object,
    keys: set[str],
    path: Path,
    where: str,
    optional: frozenset[str] | set[str] = frozenset(),
) -> dict[str, Any]:
    """`value` as a mapping with exactly `keys` (and any of `optional`), else a
    ProfileError naming the key."""
    if not isinstance(value, dict):
        raise ProfileError(f"{path}: {where.rstrip('.') or 'the file'}: expected a mapping")
    missing, unknown = sorted(keys - value.keys()), sorted(value.keys() - keys - optional)
    if missing:
        raise ProfileError(f"{path}: {where}{missing[0]}: missing")
    if unknown:
        raise ProfileError(f"{path}: {where}{unknown[0]}: unknown key")
    return value


NVSWITCH_LINKS = 18  # an HGX H100's NVLinks per GPU, all to switches


def from_sim_node(node: NodeSpec) -> NvmlNode:
    """The node of a simulated node file, as NVML would answer for it."""
    by_uuid = {g.uuid: g for g in node.gpus}
    gpus = [_sim_gpu(g, by_uuid, node.nvswitch) for g in node.gpus]
    out = NvmlNode(gpus=gpus)
    for index, spec in enumerate(node.gpus):
        if spec.mig_enabled:
            out.enable_mig(index, [m.profile for m in spec.mig_instances])
            # Placed as the simulator places them, in the file's order.
            for mig, inst in zip(out.gpus[index].migs, placed(spec), strict=True):
                mig.uuid = inst.uuid
                mig.start, mig.size = inst.placement_start, inst.placement_size
        for xid in spec.xids:  # already in the file: history, not news
            out.xid(index, xid)
    return out


def _sim_gpu(spec: GpuSpec, by_uuid: dict[str, GpuSpec], nvswitch: bool) -> Gpu:
    if nvswitch:
        links = [(NVLINK_SWITCH, NVSWITCH_BUS_ID)] * NVSWITCH_LINKS
    else:
        links = [(NVLINK_GPU, nvml_bus_id(by_uuid[p].pci)) for p in spec.nvlinks if p in by_uuid]
    _, architecture, capability, _ = model(spec.model)
    major, minor = (spec.compute_capability or capability).split(".")
    return Gpu(
        uuid=spec.uuid,
        name=spec.model,
        arch=next(n for n, name in ARCHITECTURES.items() if name == architecture),
        cc=int(major) * 10 + int(minor),
        bus=nvml_bus_id(spec.pci),
        memory=spec.memory_mib * 2**20,
        minor=spec.minor,
        numa=-1 if spec.numa is None else spec.numa,
        bridge_numa=-1 if spec.numa is None else spec.numa,
        mig_capable=mig_capable(spec),
        lost=spec.lost,
        error=ERRORS.get(spec.nvml_error, 999) if spec.nvml_error else 0,
        hang_ms=int(spec.nvml_hang_s * 1000),
        links=links,
        signals=_sim_signals(spec, len(links)),
        fabric=spec.fabric,
        processes=[Process(p.pid, p.used_memory_mib * 2**20) for p in spec.processes],
    )


def _sim_signals(spec: GpuSpec, links: int) -> Signals:
    """The degraded-device answers of a simulated GPU, as the simulated NVML gives them."""
    r = reading(spec, links)
    return Signals(
        pcie_width=r.pcie_width or 0,
        pcie_max_width=r.pcie_max_width or 0,
        pcie_gen=r.pcie_gen or 0,
        pcie_max_gen=r.pcie_max_gen or 0,
        replays=r.pcie_replays or 0,
        utilization=spec.utilization,
        clock_events=r.clock_events or 0,
        remap=model(spec.model)[1] not in _NO_ROW_REMAPPING,
        remap_pending=spec.remap_pending,
        remap_failed=spec.remap_failed,
        retired_pending=spec.retired_pages_pending,
        links_down=min(spec.nvlinks_down, links),
        memory_used_mib=spec.telemetry.memory_used_mib,
        power_mw=round(spec.telemetry.power_watts * 1000),
        temperature=spec.telemetry.temperature_celsius,
        sm_clock_mhz=spec.telemetry.sm_clock_mhz,
    )


# ---- MIG layouts used by the suites ----

A100_MIXED = {  # GPU index -> its instances; the other GPUs stay whole
    0: ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"],
    1: ["7g.40gb"],
    2: ["1g.5gb"] * 7,
}
H100_UNIFORM = {i: ["1g.10gb"] * 7 for i in range(8)}
MIG_LAYOUTS = {"a100-mixed": ("a100", A100_MIXED), "h100-uniform": ("h100", H100_UNIFORM)}


def with_mig(layout: str) -> NvmlNode:
    profile, instances = MIG_LAYOUTS[layout]
    node = from_profile(profile)
    for index, profiles in instances.items():
        node.enable_mig(index, profiles)
    return node
