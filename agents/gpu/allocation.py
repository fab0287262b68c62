"""What a container is given for its GPUs, in every API: the names NVIDIA's runtime hook
and CDI know them by, the driver features' environment, the device nodes each GPU or MIG
instance is opened through, and the IMEX channels that come with them."""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from agents.config import Flags
from agents.core.device import DeviceNode, Mount
from agents.gpu import imex, mps_paths
from agents.gpu.plan import Unit
from agents.hw.imex_channels import channel_path
from agents.kernel.edits import ContainerEdits, DeviceNames

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
CDI_VENDOR = "nvidia.com"
CDI_KIND = f"{CDI_VENDOR}/gpu"
CONTROL_DEVICES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
# A hook that reads the devices from the names of files mounted here (each one /dev/null)
# is told the directory in NVIDIA_VISIBLE_DEVICES instead of the names.
DEVICE_LIST_DIR = "/var/run/nvidia-container-devices"
# Who a CDI annotation's key says wrote it: <prefix><writer>_<response id>.
ANNOTATION_WRITER = "nvidia-device-plugin"


@dataclass(frozen=True)
class GpuNodes:
    """Where a resource's GPUs and MIG instances are opened: each physical GPU's
    /dev/nvidia<minor>, each MIG instance's /dev/nvidia-caps devices, the IMEX channels
    every container gets, and where the host has them (`dev_root` the simulator's root,
    "" on a real node)."""

    minors: Mapping[str, int]  # physical GPU UUID -> its minor
    mig_caps: Mapping[str, tuple[str, ...]]  # MIG UUID -> its capability devices
    dev_root: str = ""
    imex_channels: tuple[int, ...] = ()
    mps_root: str | None = None  # the host's flags.mpsRoot where replicas are MPS clients


def gpu_edits(
    resource: str, units: Sequence[Unit], flags: Flags, where: GpuNodes
) -> ContainerEdits:
    """What a container gets for these units of `resource` together (deviceIDStrategy
    chooses the names; the IMEX channels and the driver features add their names, device
    nodes, environment and CDI devices, in the order NVIDIA's plugin gives them; MPS
    clients get their daemon's pipe directory and shared memory whatever names them)."""
    by_index = flags.device_id_strategy == "index"
    names = tuple(dict.fromkeys(u.index if by_index else u.visible_id for u in units))
    features = _driver_features(flags)
    channels = where.imex_channels
    cdi = (
        *(f"{CDI_KIND}={name}" for name in names),
        *imex.cdi_names(channels),
        *(f"{CDI_VENDOR}/{m}=all" for m in features),
    )
    dev_root, host_root = where.dev_root, flags.host_dev_root

    def node(path: str) -> DeviceNode:
        return DeviceNode(path, dev_root + posixpath.join(host_root, path.lstrip("/")), "rw")

    controls = tuple(node(p) for p in CONTROL_DEVICES)
    gpu = {u.id: node(f"/dev/nvidia{where.minors[u.gpu_uuid]}") for u in units}
    caps = {u.id: tuple(node(c) for c in where.mig_caps.get(u.visible_id, ())) for u in units}
    env = {f"NVIDIA_{mode.upper()}": "enabled" for mode in features}
    mounts: tuple[Mount, ...] = ()
    if where.mps_root is not None:
        env |= mps_paths.client_env(resource)
        mounts = mps_paths.client_mounts(dev_root + where.mps_root, resource)
    return ContainerEdits(
        env=env,
        nodes=(
            *controls,
            *dict.fromkeys(gpu.values()),
            *dict.fromkeys(c for own in caps.values() for c in own),
            *(node(channel_path(c)) for c in channels),
        ),
        device_nodes={(resource, u.id): (*controls, gpu[u.id], *caps[u.id]) for u in units},
        mounts=mounts,
        names=DeviceNames(
            VISIBLE_DEVICES,
            names,
            cdi,
            DEVICE_LIST_DIR,
            ANNOTATION_WRITER,
            imex.companions(channels),
        ),
    )


def _driver_features(flags: Flags) -> list[str]:
    """The driver features turned on, as NVIDIA's CDI specs name their devices."""
    on = {"gdrcopy": flags.gdrcopy_enabled, "gds": flags.gds_enabled, "mofed": flags.mofed_enabled}
    return [mode for mode, enabled in on.items() if enabled]
