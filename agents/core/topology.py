"""PCIe topology: where each device hangs, how far apart two devices are, and which
NICs are nearest to which GPUs (the categories of `nvidia-smi topo -m`)."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import chain

_PCI_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_HOST_BRIDGE = re.compile(r"pci[0-9a-f]{4,8}:[0-9a-f]{2}")


class Distance(enum.IntEnum):
    """How far apart two PCI devices are, nearest first."""

    PIX = 1  # at most one PCIe switch between them
    PXB = 2  # several switches, without crossing the host bridge
    PHB = 3  # through the host bridge
    NODE = 4  # between host bridges of one NUMA node
    SYS = 5  # across NUMA nodes

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class PciLocation:
    """Where one PCI function sits: its address, its bridges (root port first),
    the host bridge above them and its NUMA node (None if unknown)."""

    address: str
    bridges: tuple[str, ...]
    host_bridge: str
    numa: int | None = None

    @classmethod
    def from_sysfs_path(cls, path: str, numa: int | None) -> PciLocation:
        """Parse a resolved sysfs device path such as
        `/sys/devices/pci0000:16/0000:16:01.0/0000:17:00.0/0000:1b:00.0`."""
        parts = [p for p in path.lower().split("/") if p]
        roots = [i for i, p in enumerate(parts) if _HOST_BRIDGE.fullmatch(p)]
        if not roots:
            raise ValueError(f"no PCI host bridge in sysfs path {path!r}")
        chain_ = parts[roots[-1] + 1 :]
        if not chain_ or not all(_PCI_ADDRESS.fullmatch(p) for p in chain_):
            raise ValueError(f"not a PCI device path below its host bridge: {path!r}")
        return cls(
            address=chain_[-1],
            bridges=tuple(chain_[:-1]),
            host_bridge=parts[roots[-1]],
            numa=numa,
        )


def distance(a: PciLocation, b: PciLocation) -> Distance:
    """The `nvidia-smi topo -m` category of the path between two devices."""
    if a.host_bridge != b.host_bridge:
        # Unknown NUMA cannot prove locality, so it counts as the far case.
        if a.numa is not None and a.numa == b.numa:
            return Distance.NODE
        return Distance.SYS
    common = _common_prefix(a.bridges, b.bridges)
    if common == 0:
        return Distance.PHB
    # Below the lowest shared bridge, one bridge on each side is one switch's
    # downstream port; more means the path crosses another switch.
    if len(a.bridges) - common <= 1 and len(b.bridges) - common <= 1:
        return Distance.PIX
    return Distance.PXB


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


class Topology:
    """The GPUs and NICs of one node by ID, and the distances between them."""

    def __init__(self, gpus: Mapping[str, PciLocation], nics: Mapping[str, PciLocation]) -> None:
        shared = set(gpus) & set(nics)
        if shared:
            raise ValueError(f"IDs used for both a GPU and a NIC: {sorted(shared)}")
        self.gpus: Mapping[str, PciLocation] = dict(gpus)
        self.nics: Mapping[str, PciLocation] = dict(nics)
        self._pairs = {g: self._nearest(self.gpus[g], self.nics) for g in sorted(self.gpus)}
        self._nic_pairs = {n: self._nearest(self.nics[n], self.gpus) for n in sorted(self.nics)}

    def matrix(self) -> dict[tuple[str, str], Distance]:
        """Distance between every ordered pair of distinct devices, GPUs and NICs alike."""
        devices = dict(chain(self.gpus.items(), self.nics.items()))
        return {
            (x, y): distance(devices[x], devices[y])
            for x in sorted(devices)
            for y in sorted(devices)
            if x != y
        }

    def pair_distance(self, gpu: str, nic: str) -> Distance:
        return distance(self.gpus[gpu], self.nics[nic])

    def nearest_nics(self, gpu_id: str) -> frozenset[str]:
        """The NICs at this GPU's smallest distance; several GPUs may share one."""
        return self._pairs[gpu_id]

    def nearest_gpus(self, nic_id: str) -> frozenset[str]:
        """The GPUs at this NIC's smallest distance."""
        return self._nic_pairs[nic_id]

    def pairs(self) -> dict[str, frozenset[str]]:
        """Each GPU and its nearest NICs."""
        return dict(self._pairs)

    @staticmethod
    def _nearest(origin: PciLocation, others: Mapping[str, PciLocation]) -> frozenset[str]:
        by_id = {i: distance(origin, loc) for i, loc in others.items()}
        if not by_id:
            return frozenset()
        best = min(by_id.values())
        return frozenset(i for i, d in by_id.items() if d == best)


def nvswitch_fabric(switch_links: Mapping[str, int]) -> dict[frozenset[str], int]:
    """The NVLink count of each pair of GPUs that reach each other through the node's
    NVSwitches (HGX/DGX, NVL72): every pair of GPUs with switch links, as many links as
    the one with fewer. Equal counts leave the choice to PCIe locality, then NUMA."""
    on_fabric = sorted(g for g, n in switch_links.items() if n > 0)
    return {
        frozenset((a, b)): min(switch_links[a], switch_links[b])
        for i, a in enumerate(on_fabric)
        for b in on_fabric[i + 1 :]
    }


def pairs_label(gpus: Mapping[str, PciLocation], nics: Mapping[str, PciLocation]) -> dict[str, str]:
    """The node label that says whether some GPU and NIC share a PCIe switch (PIX or PXB),
    from where the devices of each kind sit."""
    topology = Topology(dict(gpus), dict(nics))
    close = any(
        topology.pair_distance(gpu, next(iter(near))) <= Distance.PXB
        for gpu, near in topology.pairs().items()
        if near
    )
    return {"gpu-nic.pairs": str(close).lower()}
