"""The stand-in kubelet's client of one plugin: dial back, options, ListAndWatch and the RPCs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from agents.api import api_pb2, api_pb2_grpc

from .resources import DeviceState, PluginOptions


class PluginError(Exception):
    """A call to a plugin failed; `code` is the gRPC status code when there was one."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.details = message


def _translate(err: Exception) -> PluginError:
    if isinstance(err, grpc.aio.AioRpcError):
        return PluginError(err.details() or "", err.code())
    return PluginError(str(err) or type(err).__name__)


class PluginEndpoint:
    """One registered endpoint; the kubelet replaces it wholesale on re-registration."""

    def __init__(self, resource: str, socket: Path, channel: Any, options: PluginOptions) -> None:
        self.resource = resource
        self.socket = socket
        self.options = options
        self._channel = channel
        self._stub = api_pb2_grpc.DevicePluginStub(channel)
        self._call: Any = None

    @classmethod
    async def connect(cls, resource: str, socket: Path, dial_timeout: float) -> PluginEndpoint:
        """Dial the plugin and read its options, as the kubelet does inside Register.

        `socket` must be absolute: gRPC resolves `unix://` paths on its own.
        """
        channel = grpc.aio.insecure_channel(f"unix://{socket}")
        try:
            # The kubelet dials with a blocking 10 s timeout, then asks for the options
            # without any deadline.
            await asyncio.wait_for(channel.channel_ready(), dial_timeout)
            answer = await api_pb2_grpc.DevicePluginStub(channel).GetDevicePluginOptions(
                api_pb2.Empty()
            )
        except TimeoutError as err:
            await channel.close()
            raise PluginError(f"cannot dial {socket}: no answer within {dial_timeout}s") from err
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as err:
            await channel.close()
            raise PluginError(f"failed to get device plugin options: {_translate(err)}") from err
        options = PluginOptions(
            pre_start_required=answer.pre_start_required,
            get_preferred_allocation_available=answer.get_preferred_allocation_available,
        )
        return cls(resource, socket, channel, options)

    async def list_and_watch(self) -> AsyncIterator[dict[str, DeviceState]]:
        """Each full device list the plugin sends; ends (or raises PluginError) with the stream."""
        self._call = self._stub.ListAndWatch(api_pb2.Empty())
        try:
            async for response in self._call:
                yield {
                    device.ID: DeviceState(
                        device.health, tuple(int(node.ID) for node in device.topology.nodes)
                    )
                    for device in response.devices
                }
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as err:
            raise _translate(err) from err

    async def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must_include),
                    allocation_size=size,
                )
            ]
        )
        try:
            response = await self._stub.GetPreferredAllocation(request)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as err:
            raise _translate(err) from err
        if not response.container_responses:
            return []
        return list(response.container_responses[0].deviceIDs)

    async def allocate(self, device_ids: Sequence[str]) -> Any:
        """Allocate for one container; returns its ContainerAllocateResponse."""
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devicesIDs=list(device_ids))]
        )
        try:
            response = await self._stub.Allocate(request)
        except (grpc.aio.AioRpcError, grpc.aio.UsageError) as err:
            raise _translate(err) from err
        if not response.container_responses:
            raise PluginError(f"no containers return in allocation response {response}")
        return response.container_responses[0]

    async def close(self) -> None:
        """Cancel the stream and drop the connection; safe to call twice."""
        if self._call is not None:
            self._call.cancel()
        await self._channel.close()
