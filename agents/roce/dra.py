"""RoCE NICs as the DRA driver roce.node-agents.io publishes them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from agents.core.health import OURS
from agents.hw.lldp import Neighbour
from agents.kernel.facts import AttributeValue, DeviceFacts, pci_attributes
from agents.roce.discovery import Nic

DRIVER = "roce.node-agents.io"
LEAF_SWITCH = f"{OURS}/leafSwitch"
LEAF_PORT = f"{OURS}/leafPort"
MAX_STRING = 64  # the longest string attribute value a ResourceSlice takes


def nic_name(pci: str) -> str:
    """nic-<PCI address, ':' and '.' as '-'>: nic-0000-3b-00-0."""
    return "nic-" + pci.lower().replace(":", "-").replace(".", "-")


def devices(
    nics: Iterable[Nic], resource: str, neighbours: Mapping[str, Neighbour] | None = None
) -> tuple[DeviceFacts, ...]:
    """The NICs' devices; a NIC whose netdev has a neighbour in `neighbours` also names
    its leaf switch and port."""
    out = []
    for nic in nics:
        attributes: dict[str, AttributeValue] = {"ifName": nic.netdev, "rdmaDevice": nic.rdma}
        attributes.update(pci_attributes(nic.pci, nic.location, nic.numa))
        attributes.update(leaf_attributes((neighbours or {}).get(nic.netdev)))
        out.append(DeviceFacts(nic_name(nic.pci), resource, nic.pci, attributes))
    return tuple(out)


def leaf_attributes(neighbour: Neighbour | None) -> dict[str, AttributeValue]:
    """The leaf switch (system name, else chassis ID) and port a NIC is cabled to, while
    known; cut to the longest value a slice takes."""
    if neighbour is None:
        return {}
    return {LEAF_SWITCH: neighbour.leaf[:MAX_STRING], LEAF_PORT: neighbour.port_id[:MAX_STRING]}
