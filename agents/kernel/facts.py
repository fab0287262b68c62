"""What a family says of its devices, whatever API serves them: each device's name,
attributes and capacities, tied to the family resource (and device ID) that serves and
watches it, under the name (a DRA driver's) its attributes are published in. Free of
any wire format; agents/dra/slices.py turns it into ResourceSlices."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from agents.core.health import OURS
from agents.core.topology import PciLocation
from agents.kernel.edits import DeviceKey

STANDARD = "resource.kubernetes.io"  # the attribute domain every DRA driver shares
PCI_BUS_ID = f"{STANDARD}/pciBusID"
PCIE_ROOT = f"{STANDARD}/pcieRoot"
NUMA_NODE = f"{STANDARD}/numaNode"
PCIE_SWITCH = f"{OURS}/pcieSwitch"
HEALTH = f"{OURS}/health"  # Healthy or Degraded: a claim's selector may ask for either


@dataclass(frozen=True, order=True)
class Version:
    """A semantic-version attribute ("12.4.0"), published as `version`, not `string`."""

    value: str


AttributeValue = str | int | bool | Version


@dataclass(frozen=True)
class RequestPolicy:
    """What one allocation of a shared device consumes of a capacity (quantities):
    `default` where the claim names none, else its ask rounded up onto `minimum` +
    n * `step`, at most `maximum`."""

    default: str
    minimum: str
    maximum: str
    step: str


@dataclass(frozen=True)
class DeviceFacts:
    """One device's facts. Attribute names without a domain belong to the driver's."""

    name: str  # a DNS label, unique within the driver on this node: gpu-0
    resource: str  # the family resource that serves it (health, container edits)
    device_id: str  # its ID in that resource's inventory
    attributes: Mapping[str, AttributeValue] = field(default_factory=dict)
    capacity: Mapping[str, str] = field(default_factory=dict)  # quantities: "81920Mi"
    # Allocated to several claims at once, each consuming of the capacities with a policy.
    shared: bool = False
    policies: Mapping[str, RequestPolicy] = field(default_factory=dict)


def takes_none(parameters: Mapping[str, object]) -> str:
    """A driver's answer to any opaque config when it takes none."""
    return "this driver takes no opaque configuration"


class SharesHeld(Protocol):
    """What a family does as shares of its devices come and go (a GPU's compute mode, the
    daemon that enforces them), told every device that holds a share now; `fresh`, those
    about to serve a new share. Raises BackendError, having changed nothing, when the
    fresh ones cannot be served; a failure for devices no longer held is only logged."""

    async def __call__(self, held: frozenset[DeviceKey], fresh: frozenset[DeviceKey]) -> None: ...


@dataclass(frozen=True)
class FamilyFacts:
    """A family's devices and their facts (a device's taint comes from the cause of its
    health, agents.core.health)."""

    driver: str  # gpu.nvidia.com
    devices: tuple[DeviceFacts, ...]
    # An opaque claim config's parameters: None if the driver takes them, else why not.
    accepts: Callable[[Mapping[str, object]], str | None] = field(default=takes_none)
    shares_held: SharesHeld | None = None  # None: shares of its devices need nothing done


def pci_attributes(
    pci: str, location: PciLocation | None, numa: int | None
) -> dict[str, AttributeValue]:
    """The standard PCI attributes and our switch attribute of a device at `pci`:
    bus ID, root complex, NUMA node (left out when unknown) and, only where a PCIe switch
    lies between the device and its root port, that root port."""
    attributes: dict[str, AttributeValue] = {}
    if pci:
        attributes[PCI_BUS_ID] = pci
    if location is not None:
        attributes[PCIE_ROOT] = location.host_bridge
        if len(location.bridges) >= 2:  # root port, then at least a switch's ports
            attributes[PCIE_SWITCH] = location.bridges[0]
    if numa is not None and numa >= 0:
        attributes[NUMA_NODE] = numa
    return attributes
