"""Conversions between the agent's values and the v1beta1 wire messages, in one place:
device lists, and a container's edits as its Allocate answer, named to the container
runtime as the device-list strategies of the config say."""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from agents.api import api_pb2 as pb
from agents.config import Flags
from agents.core.device import Device, DeviceNode, Mount
from agents.kernel.edits import ContainerEdits, DeviceNames

# The device-list strategies (flags.deviceListStrategy): where the runtime learns the
# devices' names from.
ENVVAR = "envvar"  # the hook's variable
VOLUME_MOUNTS = "volume-mounts"  # files mounted into the hook's directory, one per name
CDI_ANNOTATIONS = "cdi-annotations"  # an annotation naming the CDI devices
CDI_CRI = "cdi-cri"  # the CRI's CDI device field
MOUNT_SOURCE = "/dev/null"  # a volume-mounts file says its name, nothing more


def new_response_id() -> str:
    return str(uuid.uuid4())


def device_message(device: Device) -> pb.Device:
    topology = None
    if device.numa is not None:
        topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=device.numa)])
    return pb.Device(ID=device.id, health=device.health, topology=topology)


def list_message(devices: Iterable[Device]) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(devices=[device_message(d) for d in devices])


def names_afresh(edits: ContainerEdits, flags: Flags) -> bool:
    """Whether each answer for these edits names itself anew (a CDI annotation's key
    carries a response ID of its own), so no answer may be given twice."""
    return edits.names is not None and CDI_ANNOTATIONS in flags.device_list_strategy


def allocation_message(
    edits: ContainerEdits, flags: Flags, *, response_id: Callable[[], str] = new_response_id
) -> pb.ContainerAllocateResponse:
    """One container's answer. Devices with names (a vendor's hook or CDI injects them)
    are named as `flags` says, their device nodes passed only with passDeviceSpecs and
    only where the runtime does not inject everything from CDI; other devices' nodes and
    environment are passed as they are."""
    answer = _Answer(dict(edits.env), list(edits.mounts), edits.nodes)
    if edits.names is not None:
        _name(answer, edits.names, flags, response_id)
    return pb.ContainerAllocateResponse(
        envs=answer.env,
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in answer.mounts
        ],
        devices=[
            pb.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in answer.nodes
        ],
        annotations=answer.annotations,
        cdi_devices=[pb.CDIDevice(name=name) for name in answer.cdi],
    )


@dataclass
class _Answer:
    env: dict[str, str]
    mounts: list[Mount]
    nodes: tuple[DeviceNode, ...]
    annotations: dict[str, str] = field(default_factory=dict)
    cdi: tuple[str, ...] = ()


def _name(
    answer: _Answer, names: DeviceNames, flags: Flags, response_id: Callable[[], str]
) -> None:
    """Name the devices to the runtime in each way the device-list strategies ask."""
    lists = flags.device_list_strategy
    if CDI_ANNOTATIONS in lists:
        key = f"{flags.cdi_annotation_prefix}{names.annotation}_{response_id()}"
        answer.annotations[key] = ",".join(names.cdi)
    if CDI_CRI in lists:
        answer.cdi = names.cdi
    if flags.only_cdi:
        answer.nodes = ()  # named again here, a hook would inject the devices a second time
        return
    if ENVVAR in lists:
        answer.env[names.variable] = names.joined()
        answer.env.update((c.variable, c.joined()) for c in names.companions)
    if VOLUME_MOUNTS in lists:
        answer.env[names.variable] = names.mount_dir
        answer.mounts += [
            Mount(posixpath.join(names.mount_dir, n), MOUNT_SOURCE, read_only=False)
            for n in names.names
        ]
        answer.mounts += [
            Mount(posixpath.join(names.mount_dir, c.mount_subdir, n), MOUNT_SOURCE, read_only=False)
            for c in names.companions
            for n in c.names
        ]
    if not flags.pass_device_specs:
        answer.nodes = ()
