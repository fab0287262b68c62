"""PCI address spellings and host bridges."""

from __future__ import annotations

import pytest

from agents.core.pci import host_bridge, is_pci_address, nvml_bus_id, pci_address_from_nvml


@pytest.mark.parametrize(
    ("bus_id", "address"),
    [
        ("00000000:1B:00.0", "0000:1b:00.0"),
        ("00000001:AB:1F.7", "0001:ab:1f.7"),
        ("0000:1b:00.0", "0000:1b:00.0"),
    ],
    ids=["nvml-8-digit-domain", "nonzero-domain", "already-sysfs-form"],
)
def test_pci_address_from_nvml_gives_sysfs_form(bus_id: str, address: str) -> None:
    assert pci_address_from_nvml(bus_id) == address


@pytest.mark.parametrize("bad", ["", "1b:00.0", "00000000:1B:00", "0000:1b:00.8", "x"], ids=str)
def test_pci_address_from_nvml_refuses_malformed(bad: str) -> None:
    with pytest.raises(ValueError, match="NVML PCI bus ID"):
        pci_address_from_nvml(bad)


def test_nvml_bus_id_round_trips() -> None:
    assert nvml_bus_id("0000:1b:00.0") == "00000000:1B:00.0"
    assert pci_address_from_nvml(nvml_bus_id("0000:c9:1f.3")) == "0000:c9:1f.3"


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("0000:1b:00.0", True),
        ("0000:1B:00.0", False),
        ("0000:1b:20.0", False),
        ("00000000:1b:00.0", False),
        ("0000:1b:00", False),
    ],
    ids=["lower", "upper", "device-over-1f", "long-domain", "no-function"],
)
def test_is_pci_address(text: str, ok: bool) -> None:
    assert is_pci_address(text) is ok


def test_host_bridge_is_the_root_port_bus_or_own_bus() -> None:
    assert host_bridge("0000:1b:00.0", ("0000:16:01.0", "0000:17:00.0")) == "pci0000:16"
    assert host_bridge("0000:1b:00.0") == "pci0000:1b"
