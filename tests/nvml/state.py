"""A node as the project's test NVML library (tests/nvml/lib) answers for it: its records,
changed by tests (faults, MIG layouts) and written as the library's state file, atomically.
tests/nvml/nodes.py builds one from a GPU profile or a simulated node file."""

from __future__ import annotations

import uuid as uuidlib
from dataclasses import dataclass, field
from pathlib import Path

from agents.core.gfd_facts import Fabric
from tests.nvml import mig as migs

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
class Signals:
    """What a degraded device is judged by (lib/signals.c); a PCIe figure of 0 answers
    NOT_SUPPORTED, as do row remapping and page retirement where `remap` or `retired` is
    off, and the recovery action field where `recovery` is None."""

    pcie_width: int = 16
    pcie_max_width: int = 16
    pcie_gen: int = 5
    pcie_max_gen: int = 5
    replays: int = 0
    utilization: int = 0
    clock_events: int = 0  # NVML's clock event reason bits
    memory_used_mib: int = 0
    power_mw: int = 70000
    temperature: int = 30
    sm_clock_mhz: int = 1980
    remap: bool = True
    remap_pending: bool = False
    remap_failed: bool = False
    retired: bool = True
    retired_pending: bool = False
    recovery: int | None = None
    links_down: int = 0  # the last this many NVLinks are inactive


@dataclass
class Process:
    """A process running on a GPU (lib/processes.c): a compute process, or an MPS client."""

    pid: int
    used: int | None  # bytes; None: NVML_VALUE_NOT_AVAILABLE
    mps: bool = False


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
    signals: Signals = field(default_factory=Signals)
    fabric: Fabric | None = None  # None: the fabric calls answer NOT_SUPPORTED
    processes: list[Process] = field(default_factory=list)


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
    init_hang_ms: int = 0  # nvmlInit blocks this long

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
        system = {"driver": self.driver, "nvml": self.nvml, "cuda": self.cuda}
        lines.append(_record("system", **system, init_hang_ms=self.init_hang_ms))
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
            **_signal_fields(gpu.signals),
        )
    ]
    if gpu.fabric is not None:
        out.append(_fabric_record(index, gpu.fabric))
    first_down = len(gpu.links) - gpu.signals.links_down
    for link, (kind, bus) in enumerate(gpu.links):
        down = int(link >= first_down)
        out.append(_record("link", gpu=index, link=link, type=kind, bus=bus, down=down))
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
    for p in gpu.processes:
        used = {} if p.used is None else {"used": p.used}
        out.append(_record("proc", gpu=index, pid=p.pid, **used, mps=int(p.mps)))
    for call, code in gpu.fails.items():
        out.append(_record("fail", gpu=index, call=call, code=code))
    return out


def _fabric_record(index: int, fabric: Fabric) -> str:
    return _record(
        "fabric",
        gpu=index,
        cluster=uuidlib.UUID(fabric.cluster_uuid).hex,
        clique=fabric.clique_id,
        state=fabric.state,
        status=fabric.status,
        health=fabric.health_mask,
    )


def _signal_fields(s: Signals) -> dict[str, object]:
    return {
        "pcie_width": s.pcie_width,
        "pcie_max_width": s.pcie_max_width,
        "pcie_gen": s.pcie_gen,
        "pcie_max_gen": s.pcie_max_gen,
        "replays": s.replays,
        "utilization": s.utilization,
        "clock_events": s.clock_events,
        "remap": int(s.remap),
        "remap_pending": int(s.remap_pending),
        "remap_failed": int(s.remap_failed),
        "retired": int(s.retired),
        "retired_pending": int(s.retired_pending),
        "recovery_offered": int(s.recovery is not None),
        "recovery": s.recovery or 0,
        "memory_used": s.memory_used_mib,
        "power_mw": s.power_mw,
        "temperature": s.temperature,
        "sm_clock": s.sm_clock_mhz,
    }


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
