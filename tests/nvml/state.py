"""A node as the project's test NVML library (tests/nvml/lib) answers for it: built
from a GPU profile of ../shared/mocknvml/profiles or from a simulated node file, changed by
tests (faults, MIG layouts) and written as the library's state file, atomically."""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from agents.sim.node import GpuSpec, NodeSpec
from tests.nvml import mig as migs

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
PROFILE_DIR = SHARED / "mocknvml" / "profiles"
PROFILES = ("a100", "b200", "gb200", "gb300", "h100", "l40s", "t4")

# nvml.h's values.
NVLINK_GPU = 0
NVLINK_SWITCH = 2
NVSWITCH_BUS_ID = "FFFFFFFF:FF:FF.0"  # the remote PCI bus ID NVML gives a switch port
EVENT_SINGLE_BIT_ECC = 0x1
EVENT_DOUBLE_BIT_ECC = 0x2
EVENT_XID = 0x8
ERRORS = {  # nvmlReturn_t by the names NVML's error strings and the simulator use
    "NotSupported": 3,
    "NoPermission": 4,
    "NotFound": 6,
    "GpuIsLost": 15,
    "Unknown": 999,
}
HANG_FOREVER_MS = 3_600_000

_ARCH = {"turing": 6, "ampere": 7, "ada": 8, "ada_lovelace": 8, "hopper": 9, "blackwell": 10}


@dataclass
class Mig:
    profile: str  # the name the driver gives its GPU-instance profile, e.g. 1g.10gb
    uuid: str
    gi: int
    ci: int
    gi_slices: int
    ci_slices: int
    memory_mib: int
    gi_profile: int = 0  # NVML_GPU_INSTANCE_PROFILE_* it was made from
    ci_profile: int = 0  # NVML_COMPUTE_INSTANCE_PROFILE_*
    start: int = 0  # placement, in memory slices
    size: int = 1


@dataclass
class Gpu:
    uuid: str
    name: str
    bus: str  # NVML's form: 00000000:1B:00.0
    memory: int  # bytes
    minor: int
    pci_device_id: int = 0x233010DE
    serial: str = ""
    arch: int = 9  # nvmlDeviceArchitecture_t: 6 Turing, 7 Ampere, 8 Ada, 9 Hopper, 10 Blackwell
    cc: int = 90  # CUDA compute capability, major * 10 + minor
    numa: int = -1
    mig_capable: bool = False
    mig: bool = False
    migs: list[Mig] = field(default_factory=list)
    ecc: bool = True
    ecc_uncorrected: int = 0
    lost: bool = False
    error: int = 0  # every call about this GPU answers this nvmlReturn_t
    hang_ms: int = 0  # every call about this GPU blocks this long
    links: list[tuple[int, str]] = field(default_factory=list)  # (remote type, remote bus)
    bridge: str = ""  # the PCIe host bridge (root complex) above it, e.g. pci0000:00
    bridge_numa: int = -1  # that bridge's NUMA node
    fails: dict[str, int] = field(default_factory=dict)  # call name ("*": any) -> code
    removed: bool = False  # taken off the node: NVML no longer lists it


@dataclass
class Event:
    id: int
    gpu: int
    type: int
    data: int
    gi: int = 0xFFFFFFFF
    ci: int = 0xFFFFFFFF


@dataclass
class NvmlNode:
    gpus: list[Gpu]
    driver: str = "550.163.01"
    nvml: str = "12.550.163.01"
    cuda: int = 12040
    events: list[Event] = field(default_factory=list)

    # ---- faults, as NVML shows them ----

    def xid(self, index: int, xid: int, gi: int | None = None, ci: int | None = None) -> None:
        """An XID event for the GPU (or one of its MIG instances), delivered once."""
        self._event(index, EVENT_XID, xid, gi, ci)

    def fall_off_bus(self, index: int) -> None:
        """XID 79, then GPU_IS_LOST from every call about the GPU."""
        self.xid(index, 79)
        self.gpus[index].lost = True

    def ecc_uncorrectable(self, index: int, count: int = 1) -> None:
        """The volatile uncorrectable ECC count grows; a double-bit ECC event."""
        self.gpus[index].ecc_uncorrected += count
        self._event(index, EVENT_DOUBLE_BIT_ECC, 0, None, None)

    def reset(self, index: int) -> None:
        """The GPU answers again, as after a reset: no fault, ECC volatile counts cleared."""
        gpu = self.gpus[index]
        gpu.lost, gpu.error, gpu.hang_ms, gpu.ecc_uncorrected = False, 0, 0, 0
        gpu.fails.clear()

    def _event(self, index: int, kind: int, data: int, gi: int | None, ci: int | None) -> None:
        next_id = max((e.id for e in self.events), default=0) + 1
        none = 0xFFFFFFFF
        gi_id, ci_id = none if gi is None else gi, none if ci is None else ci
        self.events.append(Event(next_id, index, kind, data, gi_id, ci_id))

    # ---- MIG ----

    def enable_mig(self, index: int, profiles: list[str]) -> None:
        """MIG mode on, with one GPU instance (and one compute instance) per profile."""
        gpu = self.gpus[index]
        gpu.mig = True
        gpu.migs = []
        taken: set[int] = set()
        used: set[int] = set()
        for slot, profile in enumerate(profiles):
            ci_slices, gi_slices, _, _ = migs.parse(profile)
            gi = migs.next_gi_id(gi_slices, taken)
            taken.add(gi)
            start, size = migs.place(gi_slices, used)
            gpu.migs.append(
                Mig(
                    profile=profile,
                    uuid=f"MIG-{uuidlib.uuid5(uuidlib.NAMESPACE_OID, f'{gpu.uuid}/{slot}')}",
                    gi=gi,
                    ci=0,
                    gi_slices=gi_slices,
                    ci_slices=ci_slices,
                    memory_mib=migs.named_memory_mib(profile, gpu.memory),
                    gi_profile=migs.gi_profile(profile).index,
                    ci_profile=migs.CI_PROFILE.get(ci_slices, 0),
                    start=start,
                    size=size,
                )
            )

    # ---- the file ----

    def write(self, path: Path) -> None:
        """The state file, replaced atomically (the library re-reads it on change)."""
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(self.render())
        tmp.replace(path)

    def render(self) -> str:
        lines = ["# node-agents test NVML state"]
        lines.append(_record("system", driver=self.driver, nvml=self.nvml, cuda=self.cuda))
        for index, gpu in enumerate(self.gpus):
            if not gpu.removed:
                lines.extend(_gpu_records(index, gpu))
        for e in self.events:
            lines.append(
                _record("event", id=e.id, gpu=e.gpu, type=e.type, data=e.data, gi=e.gi, ci=e.ci)
            )
        return "\n".join(lines) + "\n"


def _gpu_records(index: int, gpu: Gpu) -> list[str]:
    out = [
        _record(
            "gpu",
            index=index,
            uuid=gpu.uuid,
            name=gpu.name,
            serial=gpu.serial,
            bus=gpu.bus,
            pci_device_id=hex(gpu.pci_device_id),
            memory=gpu.memory,
            minor=gpu.minor,
            arch=gpu.arch,
            cc=gpu.cc,
            numa=gpu.numa,
            mig_capable=int(gpu.mig_capable),
            mig=int(gpu.mig),
            ecc=int(gpu.ecc),
            ecc_uncorrected=gpu.ecc_uncorrected,
            lost=int(gpu.lost),
            error=gpu.error,
            hang_ms=gpu.hang_ms,
            bridge=gpu.bridge,
            bridge_numa=gpu.bridge_numa,
        )
    ]
    for link, (kind, bus) in enumerate(gpu.links):
        out.append(_record("link", gpu=index, link=link, type=kind, bus=bus))
    if gpu.mig_capable:
        out.extend(_gi_profile_records(index, gpu))
    for slot, m in enumerate(gpu.migs):
        out.append(
            _record(
                "mig",
                gpu=index,
                slot=slot,
                uuid=m.uuid,
                gi=m.gi,
                ci=m.ci,
                gi_slices=m.gi_slices,
                ci_slices=m.ci_slices,
                memory_mib=m.memory_mib,
                sm=migs.SM_PER_SLICE * m.ci_slices,
                gi_profile=m.gi_profile,
                ci_profile=m.ci_profile,
                start=m.start,
                size=m.size,
            )
        )
    for call, code in gpu.fails.items():
        out.append(_record("fail", gpu=index, call=call, code=code))
    return out


def _gi_profile_records(index: int, gpu: Gpu) -> list[str]:
    """The GPU instance profiles the GPU offers; an instance's own memory where one of
    the profile exists, so that the profile and its instances agree."""
    out = []
    for p in migs.GI_PROFILES:
        made = [m.memory_mib for m in gpu.migs if m.gi_profile == p.index]
        out.append(
            _record(
                "gip",
                gpu=index,
                profile=p.index,
                id=p.id,
                slices=p.slices,
                instances=p.instances,
                memory_mib=made[0] if made else migs.memory_mib(p.slices, gpu.memory),
                sm=migs.SM_PER_SLICE * p.slices,
            )
        )
    return out


def _record(kind: str, **fields: object) -> str:
    for key, value in fields.items():
        if any(c in str(value) for c in "\t\n"):
            raise ValueError(f"{kind}.{key}: tabs and newlines cannot be written: {value!r}")
    return "\t".join([kind, *(f"{k}={v}" for k, v in fields.items())])


def nvml_bus_id(pci: str) -> str:
    """0000:1b:00.0 -> 00000000:1B:00.0 (NVML's form)."""
    domain, rest = pci.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


# ---- sources ----


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
            for mig, inst in zip(out.gpus[index].migs, spec.mig_instances, strict=True):
                mig.uuid = inst.uuid
        for xid in spec.xids:  # already in the file: history, not news
            out.xid(index, xid)
    return out


def _sim_gpu(spec: GpuSpec, by_uuid: dict[str, GpuSpec], nvswitch: bool) -> Gpu:
    if nvswitch:
        links = [(NVLINK_SWITCH, NVSWITCH_BUS_ID)] * NVSWITCH_LINKS
    else:
        links = [(NVLINK_GPU, nvml_bus_id(by_uuid[p].pci)) for p in spec.nvlinks if p in by_uuid]
    return Gpu(
        uuid=spec.uuid,
        name=spec.model,
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
