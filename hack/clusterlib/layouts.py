"""The simulated node layouts of the cluster, derived from the bundled H100 node, and each
layout's truth: which PCIe switch and root complex every device sits under, by the name
DRA publishes it as and by the ID the device plugins advertise it as."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agents.core.topology import PciLocation
from agents.sim.bundled import bundled_node

GPU_DRIVER = "gpu.nvidia.com"
NIC_DRIVER = "roce.node-agents.io"
BUNDLED = "h100-8gpu-8nic"
# Root ports moved onto the bus of another root port: two switches under one root complex.
SHARED_ROOTS = {
    "0000:25:01.0": "0000:15:02.0",
    "0000:45:01.0": "0000:35:02.0",
    "0000:a5:01.0": "0000:95:02.0",
    "0000:c5:01.0": "0000:b5:02.0",
}
LONE_GPU_SWITCH = "0000:c5:01.0"  # its NIC is left out: a GPU with no NIC on its switch
LAYOUTS = ("h100", "shared-root", "lone-gpu")


@dataclass(frozen=True)
class Place:
    """Where one device sits: its kind, switch (the root port above it, None when no
    switch lies between), root complex, and its IDs in both APIs."""

    kind: str  # "gpu" or "nic"
    dra_name: str  # gpu-0, nic-0000-19-00-0
    plugin_id: str  # GPU UUID or NIC PCI address
    switch: str | None
    root: str
    location: PciLocation


@dataclass(frozen=True)
class Layout:
    """One node layout: its simulated-node document and its devices' places."""

    name: str
    document: Mapping[str, Any]
    places: tuple[Place, ...]

    def of(self, kind: str) -> list[Place]:
        return [p for p in self.places if p.kind == kind]

    def by_dra(self) -> dict[tuple[str, str], Place]:
        """(driver, device name) -> place."""
        return {(driver_of(p.kind), p.dra_name): p for p in self.places}

    def by_plugin_id(self) -> dict[str, Place]:
        return {p.plugin_id: p for p in self.places}

    def write(self, path: Path) -> Path:
        path.write_text(yaml.safe_dump(dict(self.document), sort_keys=False))
        return path


def driver_of(kind: str) -> str:
    return GPU_DRIVER if kind == "gpu" else NIC_DRIVER


def layout(name: str) -> Layout:
    """One of LAYOUTS: the bundled node, its switches paired under shared root complexes,
    or one GPU's NIC left out."""
    doc = yaml.safe_load(bundled_node(BUNDLED).read_text())
    if name == "shared-root":
        for device in [*doc["gpus"], *doc["nics"]]:
            up = device["upstream"]
            device["upstream"] = [SHARED_ROOTS.get(up[0], up[0]), *up[1:]]
    elif name == "lone-gpu":
        doc["nics"] = [n for n in doc["nics"] if n["upstream"][0] != LONE_GPU_SWITCH]
    elif name != "h100":
        raise ValueError(f"unknown layout {name!r}: one of {', '.join(LAYOUTS)}")
    return Layout(name, doc, places(doc))


def places(doc: Mapping[str, Any]) -> tuple[Place, ...]:
    """The places of a simulated node document's GPUs and NICs (as the agent reads them: the switch
    is the root port above a device where a switch lies between them; the root complex is
    `pci<domain>:<bus>` of the root port)."""
    found = []
    for kind, key in (("gpu", "gpus"), ("nic", "nics")):
        for device in doc[key]:
            pci = str(device["pci"]).lower()
            up = tuple(str(u).lower() for u in device["upstream"])
            root = f"pci{up[0][:7]}" if up else f"pci{pci[:7]}"
            location = PciLocation(pci, up, root, device.get("numa"))
            name = f"gpu-{device['minor']}" if kind == "gpu" else "nic-" + _dashed(pci)
            plugin_id = str(device["uuid"]) if kind == "gpu" else pci
            switch = up[0] if len(up) >= 2 else None
            found.append(Place(kind, name, plugin_id, switch, root, location))
    return tuple(found)


def _dashed(pci: str) -> str:
    return pci.replace(":", "-").replace(".", "-")


def cluster_layouts(nodes: int) -> list[Layout]:
    """The layouts of nodes 0..n-1, taken in turn."""
    built = {name: layout(name) for name in LAYOUTS}
    return [built[LAYOUTS[i % len(LAYOUTS)]] for i in range(nodes)]
