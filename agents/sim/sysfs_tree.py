"""Materialise a node file as a sysfs tree in the kernel's layout, plus its device nodes.

`SysfsTree(root).apply(node)` builds <root>/sys and <root>/dev (and the driver's MIG
access files under <root>/proc), or brings them to a new node.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from agents.core.nic_signals import HW_COUNTERS
from agents.core.pci import host_bridge
from agents.hw.nvidia_caps import CAPABILITIES
from agents.sim.devnodes import DeviceNodes, mig_access_files
from agents.sim.specs import GpuSpec, NicSpec, NodeSpec

GPU_VENDOR, GPU_DEVICE, GPU_CLASS = "0x10de", "0x2330", "0x030200"
BRIDGE_VENDOR, BRIDGE_DEVICE, BRIDGE_CLASS = "0x1000", "0xc030", "0x060400"
NIC_DEVICE = "0x101d"
NIC_CLASS = {"Ethernet": "0x020000", "InfiniBand": "0x020700"}
_MAX_FILE = 4096  # every file of the tree is one short line


@dataclass(frozen=True)
class _Function:
    """One PCI function to materialise: where it lives and its identity files."""

    rel: str  # relative to sys/: devices/pci0000:16/…/0000:1b:00.0
    vendor: str
    device: str
    pci_class: str
    numa: int | None


class SysfsTree:
    """The simulated node's files under `root`: sysfs in root/sys, devices in root/dev."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sys = root / "sys"
        self.dev = DeviceNodes(root)
        self._staging = root / ".staging"
        self._shown: tuple[object, ...] | None = None  # what the tree shows, once applied

    @property
    def dev_root(self) -> Path:
        """Where device nodes live: host_path = str(dev_root) + container_path."""
        return self.root

    def apply(self, node: NodeSpec) -> None:
        """Bring the tree to `node`: states change in place, vanished devices go, new
        ones appear. Each file and link is replaced atomically once the tree exists."""
        shown = self._what_shows(node)
        if shown == self._shown:
            return  # e.g. an XID or a lost GPU: NVML's business, nothing sysfs shows
        self._shown = None  # until this apply has run to its end
        self._build(node)
        self._shown = shown

    def _what_shows(self, node: NodeSpec) -> tuple[object, ...]:
        """The part of a node that its files and device nodes show."""
        nics = tuple(
            (n.pci, n.netdev, n.rdma, n.uverbs, n.link, n.link_layer, *_signals(n))
            for n in node.nics
        )
        return (_functions(node), nics, frozenset(self.dev.wanted(node)), node.machine)

    def _build(self, node: NodeSpec) -> None:
        files = _Files(str(self._staging), fresh=not self.sys.exists())
        files.mkdir(str(self._staging))
        functions = _functions(node)
        if not files.fresh:
            self._remove_stale(functions)
        for addr, fn in functions.items():
            self._write_function(files, addr, fn)
        if not files.fresh:
            for gpu in node.gpus:
                self._prune(self._device_dir(functions, gpu.pci), set())
        for nic in node.nics:
            self._write_nic(files, str(self._device_dir(functions, nic.pci)), nic)
        if not files.fresh:
            self._prune_class_links(node)
        self.dev.apply(node)
        self._write_mig_access(files, node)
        self._write_dmi(files, node.machine)

    def _write_dmi(self, files: _Files, machine: str | None) -> None:
        """The DMI product name a node file gives (`machine`); none: no such file."""
        path = f"{self.sys}/class/dmi/id/product_name"
        if machine is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return
        files.mkdir(path.rpartition("/")[0])
        files.write(path, machine)

    def _write_mig_access(self, files: _Files, node: NodeSpec) -> None:
        """The driver's MIG access files under root/proc, as NVML's instances name them."""
        wanted = {f"{self.root}{path}": minor for path, minor in mig_access_files(node).items()}
        if not files.fresh:
            caps = f"{self.root}{CAPABILITIES}"
            for top, _dirs, names in os.walk(caps, topdown=False):
                for name in names:
                    if f"{top}/{name}" not in wanted:
                        os.unlink(f"{top}/{name}")
                if top != caps and not os.listdir(top):
                    os.rmdir(top)
        for path, minor in wanted.items():
            files.mkdir(path.rpartition("/")[0])
            files.write(path, f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1")

    def _device_dir(self, functions: dict[str, _Function], addr: str) -> Path:
        return self.sys / functions[addr].rel

    def _remove_stale(self, functions: dict[str, _Function]) -> None:
        links = self.sys / "bus/pci/devices"
        for entry in _listdir(links):
            want = functions.get(entry)
            have = os.path.realpath(links / entry)
            if want is None or have != os.path.realpath(self.sys / want.rel):
                (links / entry).unlink(missing_ok=True)
                shutil.rmtree(have, ignore_errors=True)
        hosts = {fn.rel.split("/")[1] for fn in functions.values()}
        for entry in _listdir(self.sys / "devices"):
            if entry.startswith("pci") and entry not in hosts:
                shutil.rmtree(self.sys / "devices" / entry, ignore_errors=True)

    def _write_function(self, files: _Files, addr: str, fn: _Function) -> None:
        path = f"{self.sys}/{fn.rel}"
        files.mkdir(path)
        files.write(f"{path}/vendor", fn.vendor)
        files.write(f"{path}/device", fn.device)
        files.write(f"{path}/class", fn.pci_class)
        if fn.vendor == GPU_VENDOR:
            files.write_bytes(f"{path}/config", gpu_config(fn))
        files.write(f"{path}/numa_node", str(-1 if fn.numa is None else fn.numa))
        files.link(f"{self.sys}/bus/pci/devices/{addr}", path)

    def _write_nic(self, files: _Files, pci_dir: str, nic: NicSpec) -> None:
        has_rdma = nic.rdma is not None and nic.uverbs is not None
        if not files.fresh:
            self._prune(Path(pci_dir, "net"), {nic.netdev})
            keep = {"net", "infiniband", "infiniband_verbs"} if has_rdma else {"net"}
            self._prune(Path(pci_dir), keep)
        net = f"{pci_dir}/net/{nic.netdev}"
        files.mkdir(net)
        files.write(f"{net}/operstate", nic.link)
        files.write(f"{net}/carrier_changes", str(nic.carrier_changes))
        if nic.speed_mbps is not None:  # the kernel's -1 while the link is down
            files.write(f"{net}/speed", str(nic.speed_mbps if nic.link == "up" else -1))
        elif not files.fresh:
            Path(net, "speed").unlink(missing_ok=True)
        files.link(f"{net}/device", pci_dir)
        files.link(f"{self.sys}/class/net/{nic.netdev}", net)
        if nic.rdma is None or nic.uverbs is None:
            return
        uverbs = f"uverbs{nic.uverbs}"
        if not files.fresh:
            self._prune(Path(pci_dir, "infiniband"), {nic.rdma})
            self._prune(Path(pci_dir, "infiniband_verbs"), {uverbs})
        ib = f"{pci_dir}/infiniband/{nic.rdma}"
        files.mkdir(f"{ib}/ports/1")
        up = nic.link == "up"
        files.write(f"{ib}/ports/1/state", "4: ACTIVE" if up else "1: DOWN")
        files.write(f"{ib}/ports/1/phys_state", "5: LinkUp" if up else "3: Disabled")
        files.write(f"{ib}/ports/1/link_layer", nic.link_layer)
        self._write_counters(files, f"{ib}/ports/1", nic)
        files.link(f"{ib}/device", pci_dir)
        files.link(f"{self.sys}/class/infiniband/{nic.rdma}", ib)
        verbs = f"{pci_dir}/infiniband_verbs/{uverbs}"
        files.mkdir(verbs)
        files.write(f"{verbs}/ibdev", nic.rdma)
        files.write(f"{verbs}/dev", f"231:{192 + nic.uverbs}")
        files.link(f"{verbs}/device", pci_dir)
        files.link(f"{self.sys}/class/infiniband_verbs/{uverbs}", verbs)

    def _write_counters(self, files: _Files, port: str, nic: NicSpec) -> None:
        """The node file's RDMA counters, each in the folder the kernel keeps it in;
        counters the file no longer names are removed."""
        wanted = {
            f"{port}/{'hw_counters' if name in HW_COUNTERS else 'counters'}/{name}": value
            for name, value in nic.counters
        }
        if not files.fresh:
            for folder in ("counters", "hw_counters"):
                for entry in _listdir(Path(port, folder)):
                    if f"{port}/{folder}/{entry}" not in wanted:
                        Path(port, folder, entry).unlink(missing_ok=True)
        for path, value in wanted.items():
            files.mkdir(path.rpartition("/")[0])
            files.write(path, str(value))

    def _prune_class_links(self, node: NodeSpec) -> None:
        rdma = [n for n in node.nics if n.rdma is not None and n.uverbs is not None]
        keep = {
            "net": {n.netdev for n in node.nics},
            "infiniband": {str(n.rdma) for n in rdma},
            "infiniband_verbs": {f"uverbs{n.uverbs}" for n in rdma},
        }
        for cls, names in keep.items():
            for entry in _listdir(self.sys / "class" / cls):
                if entry not in names:
                    (self.sys / "class" / cls / entry).unlink(missing_ok=True)

    def _prune(self, directory: Path, keep: set[str]) -> None:
        """Remove the subdirectories of a device directory that are not in `keep`."""
        for entry in _listdir(directory):
            path = directory / entry
            if entry not in keep and path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)


class _Files:
    """The file operations of one apply(). In a live tree each file and link is replaced
    atomically (readers never see a half-written one) and only when it changed. A fresh
    tree has no readers yet: its files are created in place, at half the cost.

    Paths are absolute strings joined with "/": a tree is several hundred files and
    links, and pathlib's objects cost more than the system calls that make them."""

    def __init__(self, staging: str, *, fresh: bool) -> None:
        self.fresh = fresh
        self._staging = staging
        self._dirs: set[str] = set()  # known to exist

    def mkdir(self, path: str) -> None:
        if path in self._dirs:
            return
        parent = path.rpartition("/")[0]
        if parent and parent not in self._dirs:
            self.mkdir(parent)
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)
        self._dirs.add(path)

    def write(self, path: str, text: str) -> None:
        self.write_bytes(path, (text + "\n").encode())

    def write_bytes(self, path: str, data: bytes) -> None:
        if self.fresh:
            _write_file(path, data)
            return
        try:
            if _read_file(path) == data:
                return
        except OSError:
            pass
        tmp = f"{self._staging}/{_name(path)}.{os.getpid()}"
        _write_file(tmp, data)
        os.replace(tmp, path)

    def link(self, link: str, target: str) -> None:
        parent = link.rpartition("/")[0]
        rel = os.path.relpath(target, parent)
        self.mkdir(parent)
        if self.fresh:
            os.symlink(rel, link)
            return
        if os.path.islink(link) and os.readlink(link) == rel:
            return
        tmp = f"{self._staging}/{_name(link)}.{os.getpid()}.link"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        os.symlink(rel, tmp)
        os.replace(tmp, link)


def _name(path: str) -> str:
    return path.rpartition("/")[2]


def _write_file(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _read_file(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, _MAX_FILE)
    finally:
        os.close(fd)


def gpu_config(fn: _Function) -> bytes:
    """A GPU's PCI configuration space as root reads it: its IDs and class, and no
    capability list (a GPU that is no vGPU)."""
    config = bytearray(256)
    config[0:2] = int(fn.vendor, 16).to_bytes(2, "little")
    config[2:4] = int(fn.device, 16).to_bytes(2, "little")
    config[9:12] = int(fn.pci_class, 16).to_bytes(3, "little")
    return bytes(config)


def _functions(node: NodeSpec) -> dict[str, _Function]:
    """Every PCI function of the node, bridges included, keyed by address."""
    out: dict[str, _Function] = {}
    for dev in node.devices:
        rel = f"devices/{host_bridge(dev.pci, dev.upstream)}"
        for bridge in dev.upstream:
            rel = f"{rel}/{bridge}"
            if bridge not in out:
                out[bridge] = _Function(rel, BRIDGE_VENDOR, BRIDGE_DEVICE, BRIDGE_CLASS, dev.numa)
        out[dev.pci] = _identity(f"{rel}/{dev.pci}", dev)
    return out


def _identity(rel: str, dev: GpuSpec | NicSpec) -> _Function:
    if isinstance(dev, GpuSpec):
        return _Function(rel, GPU_VENDOR, GPU_DEVICE, GPU_CLASS, dev.numa)
    return _Function(rel, f"0x{dev.vendor}", NIC_DEVICE, NIC_CLASS[dev.link_layer], dev.numa)


def _signals(nic: NicSpec) -> tuple[object, ...]:
    """What the NIC's files show of its degraded-device signals."""
    return (nic.speed_mbps, nic.counters, nic.carrier_changes)


def _listdir(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except OSError:
        return []
