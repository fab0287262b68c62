"""Another vendor's device plugin on the node: registers with the kubelet and flips one of
its devices between Healthy and Unhealthy every `period` seconds, so that the kubelet
rewrites its checkpoint as often (the update writes a pairing agent must see through)."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import grpc

from agents.api import api_pb2, api_pb2_grpc

HEALTH = ("Healthy", "Unhealthy")


class FlappingPlugin(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(
        self, plugin_dir: Path, resource: str = "example.com/fpga", *, period: float = 0.05
    ) -> None:
        self.socket = plugin_dir / "foreign-fpga.sock"
        self.resource = resource
        self.period = period
        self.flips = 0
        self._devices = {f"fpga{i}": HEALTH[0] for i in range(4)}
        self._changed = asyncio.Event()
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Serve, register, and flip until stopped."""
        self.socket.unlink(missing_ok=True)
        self._server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        await self._server.start()
        kubelet = self.socket.parent / "kubelet.sock"
        async with grpc.aio.insecure_channel(f"unix://{kubelet}") as channel:
            await api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version="v1beta1", endpoint=self.socket.name, resource_name=self.resource
                ),
                timeout=10,
            )
        self._task = asyncio.ensure_future(self._flap())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    async def _flap(self) -> None:
        while True:
            await asyncio.sleep(self.period)  # the flapping itself, not a synchronisation
            self.flips += 1
            self._devices["fpga0"] = HEALTH[self.flips % 2]
            self._changed.set()
            self._changed = asyncio.Event()

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return api_pb2.DevicePluginOptions()

    async def ListAndWatch(self, request: Any, context: Any) -> Any:
        while True:
            changed = self._changed
            yield api_pb2.ListAndWatchResponse(
                devices=[api_pb2.Device(ID=i, health=h) for i, h in sorted(self._devices.items())]
            )
            await changed.wait()

    async def Allocate(self, request: Any, context: Any) -> Any:
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse() for _ in request.container_requests
            ]
        )
