"""RoCE NICs as the DRA driver roce.node-agents.io publishes them."""

from __future__ import annotations

from collections.abc import Iterable

from agents.dra.devices import AttributeValue, DraDevice, Taint, pci_attributes
from agents.roce.discovery import Nic

DRIVER = "roce.node-agents.io"
LINK_DOWN_TAINT = Taint(f"{DRIVER}/link-down")


def nic_name(pci: str) -> str:
    """nic-<PCI address, ':' and '.' as '-'>: nic-0000-3b-00-0."""
    return "nic-" + pci.lower().replace(":", "-").replace(".", "-")


def devices(nics: Iterable[Nic], resource: str) -> tuple[DraDevice, ...]:
    out = []
    for nic in nics:
        attributes: dict[str, AttributeValue] = {"ifName": nic.netdev, "rdmaDevice": nic.rdma}
        attributes.update(pci_attributes(nic.pci, nic.location, nic.numa))
        out.append(DraDevice(nic_name(nic.pci), resource, nic.pci, attributes))
    return tuple(out)


def taint(reason: str | None) -> Taint:
    """Every Unhealthy NIC's taint: its link is down (or not up: link_<state>)."""
    return LINK_DOWN_TAINT
