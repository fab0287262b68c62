"""RoCE NIC functions from /sys/class/infiniband, filtered by the configured selectors."""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from agents.config import RoceSelectors
from agents.core.topology import PciLocation
from agents.hw.sysfs import RdmaDevice, Sysfs

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Nic:
    pci: str  # the device ID
    rdma: str  # mlx5_0
    port: int  # the Ethernet port NCCL uses
    netdev: str
    uverbs: str  # uverbs0
    numa: int | None
    location: PciLocation | None


def discover(sysfs: Sysfs, selectors: RoceSelectors) -> list[Nic]:
    """Every RDMA device with a port of a selected link layer (Ethernet: RoCE) that the
    selectors accept."""
    nics = []
    for dev in sysfs.rdma_devices():
        nic = _nic(dev, sysfs, selectors.link_layers)
        if nic is not None and _selected(nic, dev, selectors):
            nics.append(nic)
    return sorted(nics, key=lambda n: n.pci)


def _nic(dev: RdmaDevice, sysfs: Sysfs, link_layers: tuple[str, ...]) -> Nic | None:
    ports = [p for p in dev.ports if p.link_layer in link_layers]
    if not ports or not dev.netdevs:
        return None  # no port of a selected link layer (InfiniBand), or no netdev
    if dev.uverbs is None:
        log.warning("rdma_device_without_uverbs", rdma=dev.name, pci=dev.pci)
        return None
    return Nic(
        pci=dev.pci,
        rdma=dev.name,
        port=ports[0].num,
        netdev=dev.netdevs[0],
        uverbs=dev.uverbs,
        numa=dev.numa,
        location=sysfs.pci_location(dev.pci),
    )


def _selected(nic: Nic, dev: RdmaDevice, sel: RoceSelectors) -> bool:
    return (
        (not sel.vendors or dev.vendor in sel.vendors)
        and (not sel.if_names or nic.netdev in sel.if_names)
        and (not sel.pci_addresses or nic.pci in sel.pci_addresses)
        and (not sel.rdma_devices or nic.rdma in sel.rdma_devices)
    )
