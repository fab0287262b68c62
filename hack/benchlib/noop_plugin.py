"""The floor: a device plugin that does nothing, on grpc.aio and the project's generated
stubs. It serves its socket, registers with the kubelet, lists the devices it is given
once (all Healthy) and answers Allocate and GetPreferredAllocation with empty answers.

Run as `python -m hack.benchlib.noop_plugin --device-plugin-dir DIR --resource NAME
--devices ID,ID,...`; SIGTERM ends it. It imports only grpc and agents.api, so what it
costs is what Python and gRPC cost."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from agents.api import api_pb2 as pb
from agents.api import api_pb2_grpc as pb_grpc

KUBELET_SOCKET = "kubelet.sock"
VERSION = "v1beta1"


class NoopPlugin:
    """The DevicePlugin service; grpc finds its methods by name."""

    def __init__(self, devices: list[str]) -> None:
        self._listed = pb.ListAndWatchResponse(
            devices=[pb.Device(ID=d, health="Healthy") for d in devices]
        )

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return pb.DevicePluginOptions(get_preferred_allocation_available=True)

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        yield self._listed
        await asyncio.Event().wait()  # nothing ever changes

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        return pb.PreferredAllocationResponse(
            container_responses=[
                pb.ContainerPreferredAllocationResponse() for _ in request.container_requests
            ]
        )

    async def Allocate(self, request: Any, context: Any) -> Any:
        return pb.AllocateResponse(
            container_responses=[pb.ContainerAllocateResponse() for _ in request.container_requests]
        )

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        return pb.PreStartContainerResponse()


async def serve(plugin_dir: Path, resource: str, devices: list[str]) -> None:
    name = f"noop-{os.getpid()}.sock"
    path = plugin_dir / name
    server = grpc.aio.server()
    pb_grpc.add_DevicePluginServicer_to_server(NoopPlugin(devices), server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stopping.set)
    async with grpc.aio.insecure_channel(f"unix://{plugin_dir / KUBELET_SOCKET}") as channel:
        await pb_grpc.RegistrationStub(channel).Register(
            pb.RegisterRequest(
                version=VERSION,
                endpoint=name,
                resource_name=resource,
                options=pb.DevicePluginOptions(get_preferred_allocation_available=True),
            ),
            timeout=10,
            wait_for_ready=True,
        )
    try:
        await stopping.wait()
    finally:
        await server.stop(None)
        path.unlink(missing_ok=True)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m hack.benchlib.noop_plugin")
    parser.add_argument("--device-plugin-dir", type=Path, required=True)
    parser.add_argument("--resource", required=True)
    parser.add_argument("--devices", required=True, help="comma-separated device IDs")
    args = parser.parse_args()
    asyncio.run(serve(args.device_plugin_dir, args.resource, args.devices.split(",")))


if __name__ == "__main__":
    main()
