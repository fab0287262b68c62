"""The character devices a simulated node passes to containers, created under its root
with the numbers of /dev/null so that a real container runtime can start them."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import structlog

from agents.hw.imex_channels import CHANNEL_DIR, channel_path
from agents.hw.nvidia_caps import CAP_DEVICE, access_files
from agents.sim.specs import NodeSpec

log = structlog.get_logger(__name__)

_NULL = os.makedev(1, 3)
_GPU_COMMON = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools")
_OWNED = re.compile(
    r"nvidia\d+|infiniband/uverbs\d+|nvidia-caps/nvidia-cap\d+|nvidia-caps-imex-channels/channel\d+"
)
# The driver's numbering of capability devices: config 1, monitor 2, then per GPU minor
# 15 GPU instances of 9 entries each (the instance's access, then 8 compute instances').
_CAPS_FIRST, _CAPS_PER_GPU, _CAPS_PER_GI = 3, 135, 9


def mig_access_files(node: NodeSpec) -> dict[str, int]:
    """The driver's access file (its /proc path) of every MIG GPU and compute instance on
    the node, with the minor of the capability device it names."""
    out: dict[str, int] = {}
    for gpu in node.gpus:
        if not gpu.mig_enabled:
            continue
        for mig in gpu.mig_instances:
            gi_file, ci_file = access_files(gpu.minor, mig)
            gi = _CAPS_FIRST + gpu.minor * _CAPS_PER_GPU + mig.gpu_instance * _CAPS_PER_GI
            out[gi_file] = gi
            out[ci_file] = gi + 1 + mig.compute_instance
    return out


class DeviceNodes:
    """Device nodes under <root>/dev; `host_path("/dev/nvidia0")` is where one lives."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def host_path(self, container_path: str) -> str:
        return str(self.root) + container_path

    def wanted(self, node: NodeSpec) -> set[str]:
        """Container paths (`/dev/...`) of the device nodes the node has."""
        out = {f"/dev/{name}" for name in _GPU_COMMON} if node.gpus else set()
        out |= {f"/dev/nvidia{g.minor}" for g in node.gpus}
        rdma = [n for n in node.nics if n.rdma is not None and n.uverbs is not None]
        out |= {f"/dev/infiniband/uverbs{n.uverbs}" for n in rdma}
        if rdma:
            out.add("/dev/infiniband/rdma_cm")
        out |= {f"{CAP_DEVICE}{minor}" for minor in mig_access_files(node).values()}
        out |= {channel_path(c) for c in node.imex_channels}
        return out

    def apply(self, node: NodeSpec) -> None:
        wanted = self.wanted(node)
        for container_path in sorted(wanted):
            self._create(Path(self.host_path(container_path)))
        dev = self.root / "dev"
        owned = (
            *_entries(dev, ""),
            *_entries(dev / "infiniband", "infiniband/"),
            *_entries(dev / "nvidia-caps", "nvidia-caps/"),
            *_entries(self.root / CHANNEL_DIR.lstrip("/"), "nvidia-caps-imex-channels/"),
        )
        for name in owned:
            if _OWNED.fullmatch(name) and f"/dev/{name}" not in wanted:
                (dev / name).unlink(missing_ok=True)

    def _create(self, path: Path) -> None:
        try:
            if stat.S_ISCHR(path.lstat().st_mode) or path.is_file():
                return
        except FileNotFoundError:
            pass
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, _NULL)
        except PermissionError as exc:
            log.warning("device_node_fallback", path=str(path), error=str(exc))
            path.touch()
        os.chmod(path, 0o666)  # mknod's mode is masked by the umask


def _entries(directory: Path, prefix: str) -> list[str]:
    try:
        return [prefix + name for name in os.listdir(directory)]
    except OSError:
        return []
