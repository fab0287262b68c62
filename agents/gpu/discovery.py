"""GPUs as NVML reports them, placed in the PCI tree and NUMA node that sysfs shows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from agents.core.pci import pci_address_from_nvml
from agents.core.topology import Distance, PciLocation, distance, nvswitch_fabric
from agents.hw.nvml import GpuInfo, MigInstance, Nvml
from agents.hw.sysfs import Sysfs

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class DriverVersions:
    """What NVML says of the node's driver, shared by every device: "550.54.15", "12.4"."""

    version: str = ""
    cuda_version: str = ""


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    pci: str  # sysfs form, 0000:1b:00.0; "" when NVML gave no usable bus ID
    numa: int | None
    minor: int
    model: str
    memory_mib: int
    mig_enabled: bool
    mig: tuple[MigInstance, ...]
    nvlink_peers: tuple[str, ...]  # UUIDs of peer GPUs, once per link
    location: PciLocation | None
    nvswitch_links: int = 0  # NVLinks to the node's NVSwitch fabric
    brand: str = ""  # as NVML names it: "Nvidia"; "" unknown
    architecture: str = ""  # "Hopper"
    compute_capability: str = ""  # "9.0"
    mig_capable: bool = False
    pci_class: int | None = None  # from sysfs: 0x030200 a 3D controller; None unknown

    def capability(self) -> tuple[int, int] | None:
        """The compute capability as (major, minor); None where NVML gave none."""
        major, _, minor = self.compute_capability.partition(".")
        if not (major.isdigit() and minor.isdigit()):
            return None
        return int(major), int(minor)


def discover(nvml: Nvml, sysfs: Sysfs) -> list[Gpu]:
    """Every GPU NVML lists, with its NUMA node and PCI location from sysfs."""
    infos = list(nvml.gpus())
    by_bus = {pci: i.uuid for i in infos if (pci := _sysfs_form(i.pci_bus_id))}
    return [_gpu(info, by_bus, sysfs) for info in infos]


def _sysfs_form(bus_id: str) -> str | None:
    """NVML's bus ID in sysfs form; None for one that names no PCI function (the
    NVSwitch sentinel FFFFFFFF:FF:FF.0, an empty or odd answer)."""
    try:
        pci = pci_address_from_nvml(bus_id)
    except ValueError:
        return None
    return None if pci.startswith("ffff") else pci


def _gpu(info: GpuInfo, by_bus: dict[str, str], sysfs: Sysfs) -> Gpu:
    pci = _sysfs_form(info.pci_bus_id)
    if pci is None:
        log.warning(
            "gpu_pci_unknown",
            gpu=info.uuid,
            bus_id=info.pci_bus_id,
            effect="served without NUMA node or PCI locality",
        )
    numa = sysfs.numa_node(pci) if pci else None
    # None behind some hypervisors (and on mock NVML): NUMA distances then
    location = sysfs.pci_location(pci) if pci else None
    peers = tuple(by_bus[p] for bus in info.nvlink_peers if (p := _sysfs_form(bus)) in by_bus)
    return Gpu(
        index=info.index,
        uuid=info.uuid,
        pci=pci or "",
        numa=numa,
        minor=info.minor,
        model=info.name,
        memory_mib=info.memory_mib,
        mig_enabled=info.mig_enabled,
        mig=info.mig_instances if info.mig_enabled else (),
        nvlink_peers=peers,
        location=location,
        nvswitch_links=info.nvswitch_links,
        brand=info.brand,
        architecture=info.architecture,
        compute_capability=info.compute_capability,
        mig_capable=info.mig_capable,
        pci_class=sysfs.pci_class(pci) if pci else None,
    )


def gpu_distance(a: Gpu, b: Gpu) -> Distance:
    """The PCIe distance of two GPUs; by NUMA node alone where sysfs has no PCI path."""
    if a.location is None or b.location is None:
        return Distance.NODE if a.numa == b.numa else Distance.SYS
    return distance(a.location, b.location)


def nvlink_counts(gpus: Sequence[Gpu]) -> dict[frozenset[str], int]:
    """Number of NVLinks between each connected pair of GPUs.

    A link may be reported by one end or by both: each direction is counted apart and
    the larger count wins. GPUs on the node's NVSwitch fabric all reach each other.
    """
    directed: dict[tuple[str, str], int] = {}
    for gpu in gpus:
        for peer in gpu.nvlink_peers:
            if peer != gpu.uuid:
                directed[(gpu.uuid, peer)] = directed.get((gpu.uuid, peer), 0) + 1
    counts: dict[frozenset[str], int] = {}
    for (a, b), n in directed.items():
        pair = frozenset((a, b))
        counts[pair] = max(counts.get(pair, 0), n)
    for pair, n in nvswitch_fabric({g.uuid: g.nvswitch_links for g in gpus}).items():
        counts[pair] = max(counts.get(pair, 0), n)
    return counts
