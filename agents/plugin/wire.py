"""Conversions between core values and the v1beta1 wire messages, in one place."""

from __future__ import annotations

from collections.abc import Iterable

from agents.api import api_pb2 as pb
from agents.core.device import ContainerAllocation, Device


def device_message(device: Device) -> pb.Device:
    topology = None
    if device.numa is not None:
        topology = pb.TopologyInfo(nodes=[pb.NUMANode(ID=device.numa)])
    return pb.Device(ID=device.id, health=device.health, topology=topology)


def list_message(devices: Iterable[Device]) -> pb.ListAndWatchResponse:
    return pb.ListAndWatchResponse(devices=[device_message(d) for d in devices])


def allocation_message(allocation: ContainerAllocation) -> pb.ContainerAllocateResponse:
    return pb.ContainerAllocateResponse(
        envs=dict(allocation.envs),
        mounts=[
            pb.Mount(container_path=m.container_path, host_path=m.host_path, read_only=m.read_only)
            for m in allocation.mounts
        ],
        devices=[
            pb.DeviceSpec(
                container_path=d.container_path, host_path=d.host_path, permissions=d.permissions
            )
            for d in allocation.devices
        ],
        annotations=dict(allocation.annotations),
        cdi_devices=[pb.CDIDevice(name=name) for name in allocation.cdi_devices],
    )
