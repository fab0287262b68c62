"""The nodes the tests give the project's test NVML library: built from a GPU profile of
../shared/mocknvml/profiles or from a simulated node file, and the MIG layouts the suites
use."""

from __future__ import annotations

from pathlib import Path

import yaml

from agents.hw.nvml import ARCHITECTURES
from agents.sim.node import GpuSpec, NodeSpec
from agents.sim.nvml import model, placed
from tests.nvml.state import (
    ERRORS,
    NVLINK_GPU,
    NVLINK_SWITCH,
    NVSWITCH_BUS_ID,
    Gpu,
    NvmlNode,
    nvml_bus_id,
)

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
PROFILE_DIR = SHARED / "mocknvml" / "profiles"
PROFILES = ("a100", "b200", "gb200", "gb300", "h100", "l40s", "t4")

_ARCH = {"turing": 6, "ampere": 7, "ada": 8, "ada_lovelace": 8, "hopper": 9, "blackwell": 10}


def profile_path(profile: str) -> Path:
    return PROFILE_DIR / f"mock-nvml-config-{profile}.yaml"


def from_profile(profile: str) -> NvmlNode:
    """The node a GPU profile describes: its GPUs, PCI addresses, memory, ECC, MIG
    capability and NVSwitch fabric (every link to a switch when the profile has switches,
    as the profiles' own comments describe; none otherwise)."""
    doc = yaml.safe_load(profile_path(profile).read_text())
    system, defaults = doc["system"], doc["device_defaults"]
    nvlink = doc.get("nvlink") or {}
    switch_links = int(nvlink.get("links_per_gpu", 0)) if nvlink.get("switches") else 0
    bridges = _bridges(doc)
    gpus = []
    for device in doc["devices"]:
        spec = {**defaults, **device}
        mig = spec.get("mig") or {}
        gpus.append(
            Gpu(
                uuid=str(spec["uuid"]),
                name=str(spec["name"]),
                bus=nvml_bus_id(str(device["pci"]["bus_id"])),
                memory=int(spec["memory"]["total_bytes"]),
                minor=int(spec.get("minor_number", device["index"])),
                pci_device_id=int(defaults.get("pci", {}).get("device_id", 0x233010DE)),
                serial=str(spec.get("serial", "")),
                arch=_ARCH.get(str(spec.get("architecture", "")), 9),
                cc=int(spec["compute_capability"]["major"]) * 10
                + int(spec["compute_capability"]["minor"]),
                mig_capable=int(mig.get("max_gpu_instances", 0)) > 0,
                mig=mig.get("mode_current") == "enabled",
                ecc=(spec.get("ecc") or {}).get("mode_current") == "enabled",
                links=[(NVLINK_SWITCH, NVSWITCH_BUS_ID)] * switch_links,
            )
        )
        gpus[-1].bridge, gpus[-1].bridge_numa = bridges.get(gpus[-1].bus, ("", -1))
    major, minor = int(system["cuda_version_major"]), int(system["cuda_version_minor"])
    return NvmlNode(
        gpus=gpus,
        driver=str(system["driver_version"]),
        nvml=str(system["nvml_version"]),
        cuda=major * 1000 + minor * 10,
    )


def _bridges(doc: dict[str, object]) -> dict[str, tuple[str, int]]:
    """NVML bus ID -> (host bridge, its NUMA node), from the profile's PCIe topology."""
    topology = doc.get("pcie_topology")
    out: dict[str, tuple[str, int]] = {}
    if not isinstance(topology, dict):
        return out
    for root in topology.get("root_complexes") or []:
        for bus in root.get("devices") or []:
            out[nvml_bus_id(str(bus))] = (str(root["id"]), int(root.get("numa_node", -1)))
    return out


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
    major, minor = capability.split(".")
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
        mig_capable=spec.mig_enabled or "A100" in spec.model or "H100" in spec.model,
        lost=spec.lost,
        error=ERRORS.get(spec.nvml_error, 999) if spec.nvml_error else 0,
        hang_ms=int(spec.nvml_hang_s * 1000),
        links=links,
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
