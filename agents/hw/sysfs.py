"""The kernel's sysfs as discovery reads it: PCI paths, NUMA nodes, vendors, RDMA devices.

`Sysfs(root)` is a value; a simulated node passes the root of its materialised tree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from agents.core.nic_signals import HW_COUNTERS, PORT_COUNTERS, NicReading
from agents.core.topology import PciLocation
from agents.errors import BackendError

_CHUNK = 4096  # a sysfs attribute is at most one page
NVIDIA_VENDOR = "0x10de"


@dataclass(frozen=True)
class RdmaPort:
    num: int
    state: str  # "ACTIVE", "DOWN", ... (the word after "4: ")
    link_layer: str  # "Ethernet" or "InfiniBand"


@dataclass(frozen=True)
class RdmaDevice:
    """One RDMA device (`mlx5_0`) and the PCI function behind it."""

    name: str
    pci: str  # 0000:1c:00.0
    vendor: str  # "15b3"; "" if unknown
    numa: int | None
    netdevs: tuple[str, ...]
    ports: tuple[RdmaPort, ...]
    uverbs: str | None  # "uverbs0": /dev/infiniband/uverbs0


@dataclass(frozen=True)
class Sysfs:
    """Read-only queries on a sysfs tree. Whatever is absent, or vanishes while being read,
    answers "" (None for NUMA nodes); only a missing root raises BackendError."""

    root: Path = Path("/sys")

    def pci_real_path(self, addr: str) -> str:
        """The device's directory relative to the root, without a leading slash:
        `devices/pci0000:16/0000:16:01.0/0000:17:00.0/0000:18:00.0/0000:1b:00.0`."""
        link = self.root / "bus/pci/devices" / addr
        try:
            real = Path(os.path.realpath(link, strict=True))
            return real.relative_to(self.root.resolve()).as_posix()
        except (OSError, ValueError):
            self._check_root()
            return ""

    def pci_location(self, addr: str) -> PciLocation | None:
        """Where the device sits in the PCI tree; None if sysfs does not show it."""
        path = self.pci_real_path(addr)
        if not path:
            return None
        try:
            return PciLocation.from_sysfs_path(path, self.numa_node(addr))
        except ValueError:
            return None

    def numa_node(self, addr: str) -> int | None:
        """The device's NUMA node; None when absent or unknown (the kernel's -1)."""
        text = self._read(self.root / "bus/pci/devices" / addr / "numa_node")
        return _numa(text)

    def port_state(self, rdma: str, port: int) -> str:
        """`ACTIVE`, `DOWN`, ... of one port of an RDMA device."""
        # Polled every second for every NIC: a plain string path, no Path objects.
        return _port_state(self._read(f"{self.root}/class/infiniband/{rdma}/ports/{port}/state"))

    def pci_model(self, addr: str) -> str:
        """`vendor:device` of a PCI function (`15b3:1021`): NICs of one model are expected
        to run at one speed; "" when sysfs does not show it."""
        base = f"{self.root}/bus/pci/devices/{addr}"
        vendor, device = (
            _hex_id(self._read(f"{base}/vendor")),
            _hex_id(self._read(f"{base}/device")),
        )
        return f"{vendor}:{device}" if vendor and device else ""

    def pci_class(self, addr: str) -> int | None:
        """The function's PCI class (0x030200: a 3D controller); None when unreadable."""
        text = self._read(f"{self.root}/bus/pci/devices/{addr}/class")
        try:
            return int(text, 16) if text else None
        except ValueError:
            return None

    def machine_type(self) -> str | None:
        """The DMI product name (what GFD labels gpu.machine); None without one."""
        return self._read(self.root / "class/dmi/id/product_name")

    def nvidia_configs(self) -> list[bytes] | None:
        """The configuration space of every NVIDIA PCI function (vendor 0x10de); None when
        one cannot be read at all. Unprivileged readers get only its first 64 bytes."""
        out: list[bytes] = []
        base = self.root / "bus/pci/devices"
        for addr in sorted(self._names(base)):
            if self._read(base / addr / "vendor") != NVIDIA_VENDOR:
                continue
            try:
                out.append((base / addr / "config").read_bytes())
            except OSError:
                return None
        return out

    def nic_reading(self, ifname: str, rdma: str | None, port: int = 1) -> NicReading:
        """Blocking: the degraded-device signals of one NIC (docs/degraded.md); a file
        that is absent or odd leaves its field None (a counter: left out)."""
        net = f"{self.root}/class/net/{ifname}"
        state = self._read(f"{net}/operstate")
        counters: list[tuple[str, int]] = []
        if rdma is not None:
            base = f"{self.root}/class/infiniband/{rdma}/ports/{port}"
            for folder, names in (("counters", PORT_COUNTERS), ("hw_counters", HW_COUNTERS)):
                for name in names:
                    value = _count(self._read(f"{base}/{folder}/{name}"))
                    if value is not None:
                        counters.append((name, value))
        return NicReading(
            speed_mbps=_count(self._read(f"{net}/speed")),
            carrier_changes=_count(self._read(f"{net}/carrier_changes")),
            up=_OPERSTATES.get(state or ""),
            counters=tuple(counters),
        )

    def rdma_devices(self) -> list[RdmaDevice]:
        """Every RDMA device with a PCI function behind it, sorted by name."""
        uverbs = self._uverbs_by_ibdev()
        out: list[RdmaDevice] = []
        for name in sorted(self._names(self.root / "class/infiniband")):
            device = self._rdma_device(name, uverbs.get(name))
            if device is not None:
                out.append(device)
        return out

    def _rdma_device(self, name: str, uverbs: str | None) -> RdmaDevice | None:
        base = self.root / "class/infiniband" / name
        try:
            pci_dir = Path(os.path.realpath(base / "device", strict=True))
        except OSError:
            return None
        return RdmaDevice(
            name=name,
            pci=pci_dir.name,
            vendor=_hex_id(self._read(pci_dir / "vendor")),
            numa=_numa(self._read(pci_dir / "numa_node")),
            netdevs=tuple(sorted(self._names(pci_dir / "net"))),
            ports=self._ports(base / "ports"),
            uverbs=uverbs,
        )

    def _ports(self, ports_dir: Path) -> tuple[RdmaPort, ...]:
        out: list[RdmaPort] = []
        for entry in self._names(ports_dir):
            if not entry.isdigit():
                continue
            state = _port_state(self._read(ports_dir / entry / "state"))
            layer = self._read(ports_dir / entry / "link_layer")
            if state and layer:
                out.append(RdmaPort(int(entry), state, layer))
        return tuple(sorted(out, key=lambda p: p.num))

    def _uverbs_by_ibdev(self) -> dict[str, str]:
        out: dict[str, str] = {}
        verbs = self.root / "class/infiniband_verbs"
        for entry in sorted(self._names(verbs)):
            ibdev = self._read(verbs / entry / "ibdev") if entry.startswith("uverbs") else None
            if ibdev is not None:
                out.setdefault(ibdev, entry)
        return out

    def _names(self, directory: Path) -> list[str]:
        try:
            return [entry.name for entry in os.scandir(directory)]
        except OSError:
            self._check_root()
            return []

    def _read(self, path: Path | str) -> str | None:
        # Bare system calls: a buffered text file costs three times as many, and port
        # states are read for every NIC every second.
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                data = b"".join(iter(lambda: os.read(fd, _CHUNK), b""))
            finally:
                os.close(fd)
            return data.decode(errors="replace").strip()
        except OSError:
            self._check_root()
            return None

    def _check_root(self) -> None:
        if not self.root.is_dir():
            raise BackendError(f"no sysfs at {self.root}")


# The kernel's operstate: up, down, or a state that says nothing of the link (unknown).
_OPERSTATES = {"up": True, "down": False, "lowerlayerdown": False, "notpresent": False}


def _count(text: str | None) -> int | None:
    """A counter or speed as sysfs gives it; None when absent, not a number, or negative
    (the kernel's -1: speed unknown while the link is down)."""
    try:
        value = int(text) if text else -1
    except ValueError:
        return None
    return value if value >= 0 else None


def _numa(text: str | None) -> int | None:
    try:
        node = int(text) if text is not None else -1
    except ValueError:
        return None
    return node if node >= 0 else None


def _hex_id(text: str | None) -> str:
    if not text:
        return ""
    return text.lower().removeprefix("0x")


def _port_state(text: str | None) -> str:
    if not text:
        return ""
    return text.split(":", 1)[-1].strip()
