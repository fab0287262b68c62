"""PCI addresses in their two spellings (sysfs `0000:1b:00.0`, NVML `00000000:1B:00.0`)
and the host bridge above a device. Pure string functions."""

from __future__ import annotations

import re

_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]")
_NVML_BUS_ID = re.compile(r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-1][0-9a-fA-F]\.[0-7]")


def is_pci_address(text: str) -> bool:
    """True for a sysfs-form address: 4-digit domain, lower case, `dddd:bb:dd.f`."""
    return _ADDRESS.fullmatch(text) is not None


def pci_address_from_nvml(bus_id: str) -> str:
    """NVML's `00000000:1B:00.0` as sysfs spells it: `0000:1b:00.0`."""
    if _NVML_BUS_ID.fullmatch(bus_id) is None:
        raise ValueError(f"not an NVML PCI bus ID: {bus_id!r}")
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):04x}:{rest.lower()}"


def nvml_bus_id(address: str) -> str:
    """A sysfs-form address as NVML spells it: 8-digit domain, upper case."""
    if not is_pci_address(address):
        raise ValueError(f"not a PCI address: {address!r}")
    domain, rest = address.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


def host_bridge(address: str, upstream: tuple[str, ...] = ()) -> str:
    """The host bridge directory (`pci0000:16`) above a device: the bus of its root
    port, or the device's own bus when it hangs directly off the host bridge."""
    top = upstream[0] if upstream else address
    return "pci" + top.rsplit(":", 1)[0]
