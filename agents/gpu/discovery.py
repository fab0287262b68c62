"""GPUs as NVML reports them, placed in the PCI tree and NUMA node that sysfs shows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agents.core.pci import pci_address_from_nvml
from agents.core.topology import PciLocation
from agents.hw.nvml import GpuInfo, MigInstance, Nvml
from agents.hw.sysfs import Sysfs


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    pci: str  # sysfs form, 0000:1b:00.0
    numa: int | None
    minor: int
    model: str
    memory_mib: int
    mig_enabled: bool
    mig: tuple[MigInstance, ...]
    nvlink_peers: tuple[str, ...]  # UUIDs of peer GPUs, once per link
    location: PciLocation | None


def discover(nvml: Nvml, sysfs: Sysfs) -> list[Gpu]:
    """Every GPU NVML lists, with its NUMA node and PCI location from sysfs."""
    infos = list(nvml.gpus())
    by_bus = {pci_address_from_nvml(i.pci_bus_id): i.uuid for i in infos}
    return [_gpu(info, by_bus, sysfs) for info in infos]


def _gpu(info: GpuInfo, by_bus: dict[str, str], sysfs: Sysfs) -> Gpu:
    pci = pci_address_from_nvml(info.pci_bus_id)
    numa = sysfs.numa_node(pci)
    location = sysfs.pci_location(pci)  # None behind some hypervisors: NUMA distances then
    peers = tuple(
        by_bus[pci_address_from_nvml(bus)]
        for bus in info.nvlink_peers
        if pci_address_from_nvml(bus) in by_bus
    )
    return Gpu(
        index=info.index,
        uuid=info.uuid,
        pci=pci,
        numa=numa,
        minor=info.minor,
        model=info.name,
        memory_mib=info.memory_mib,
        mig_enabled=info.mig_enabled,
        mig=info.mig_instances if info.mig_enabled else (),
        nvlink_peers=peers,
        location=location,
    )


def nvlink_counts(gpus: Sequence[Gpu]) -> dict[frozenset[str], int]:
    """Number of NVLinks between each connected pair of GPUs.

    A link may be reported by one end or by both: each direction is counted apart and
    the larger count wins.
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
    return counts
