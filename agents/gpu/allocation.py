"""What a container is told of its GPUs: env, mounts, CDI names and annotations, device
nodes, each as the device-list strategies and the driver flags of the config say."""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Callable, Sequence

from agents.config import Flags
from agents.core.device import ContainerAllocation, DeviceSpec, Mount

VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
CDI_VENDOR = "nvidia.com"
CDI_KIND = f"{CDI_VENDOR}/gpu"
# volume-mounts: the runtime hook reads the devices from the names of the files
# mounted here (each one /dev/null), and the env var then names the directory.
DEVICE_LIST_DIR = "/var/run/nvidia-container-devices"
DEVICE_LIST_SOURCE = "/dev/null"
# cdi-annotations: the key is <prefix><name>_<response id>, one per container response.
CDI_ANNOTATION_NAME = "nvidia-device-plugin"


def new_response_id() -> str:
    return str(uuid.uuid4())


def container_allocation(
    names: Sequence[str],
    device_paths: Sequence[str],
    flags: Flags,
    *,
    dev_root: str = "",
    response_id: Callable[[], str] = new_response_id,
) -> ContainerAllocation:
    """The answer for one container given the GPUs or MIG instances `names` (UUIDs or
    indices, as deviceIDStrategy says) and the device nodes they are opened through.

    `dev_root` is where a simulated node keeps its device nodes ("" on a real node).
    """
    features = [
        mode
        for mode, on in (
            ("gdrcopy", flags.gdrcopy_enabled),
            ("gds", flags.gds_enabled),
            ("mofed", flags.mofed_enabled),
        )
        if on
    ]
    envs = {f"NVIDIA_{mode.upper()}": "enabled" for mode in features}
    cdi = [f"{CDI_KIND}={name}" for name in names]
    cdi += [f"{CDI_VENDOR}/{mode}=all" for mode in features]
    lists = flags.device_list_strategy
    annotations: dict[str, str] = {}
    if "cdi-annotations" in lists:
        key = f"{flags.cdi_annotation_prefix}{CDI_ANNOTATION_NAME}_{response_id()}"
        annotations[key] = ",".join(cdi)
    cdi_devices = tuple(cdi) if "cdi-cri" in lists else ()
    if flags.only_cdi:
        # The runtime injects everything from the CDI specs: naming the devices again
        # would have a legacy runtime hook inject them a second time.
        return ContainerAllocation(envs=envs, annotations=annotations, cdi_devices=cdi_devices)
    mounts: tuple[Mount, ...] = ()
    if "envvar" in lists:
        envs[VISIBLE_DEVICES] = ",".join(names)
    if "volume-mounts" in lists:
        envs[VISIBLE_DEVICES] = DEVICE_LIST_DIR
        mounts = tuple(
            Mount(posixpath.join(DEVICE_LIST_DIR, name), DEVICE_LIST_SOURCE, read_only=False)
            for name in names
        )
    specs: tuple[DeviceSpec, ...] = ()
    if flags.pass_device_specs:
        root = flags.host_dev_root
        specs = tuple(
            DeviceSpec(path, dev_root + posixpath.join(root, path.lstrip("/")), "rw")
            for path in device_paths
        )
    return ContainerAllocation(envs, specs, mounts, annotations, cdi_devices)
