"""One DevicePlugin gRPC server for one resource, on its own 0600 unix socket."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

import grpc
import structlog

from agents.api import api_pb2 as pb
from agents.api import api_pb2_grpc as pb_grpc
from agents.config import Flags
from agents.core.device import Device
from agents.errors import AllocationError, Code
from agents.kernel.catalogue import Inventory, Resource, Withheld
from agents.kernel.edits import ContainerEdits
from agents.kernel.socket_server import GRACE_S, UnixServer
from agents.kernel.telemetry import NoTelemetry, Telemetry
from agents.kernel.versioned import Versioned
from agents.plugin import requests, wire
from agents.tasks import first

log = structlog.get_logger(__name__)

_CODES = {
    Code.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Code.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    Code.INTERNAL: grpc.StatusCode.INTERNAL,
}
T = TypeVar("T")
DEFAULT_FLAGS = Flags()  # the config's defaults: device names in the environment
MESSAGES_KEPT = 1024  # wire messages kept per resource server: past it, all are forgotten


def socket_name(resource: str) -> str:
    """nvidia.com/gpu -> node-agent-nvidia.com-gpu.sock (a plain file name)."""
    return "node-agent-" + re.sub(r"[^A-Za-z0-9_.-]", "-", resource) + ".sock"


class DevicePluginServer:
    """Serves one resource; `start()` returns once the socket answers, `stop()` is idempotent.

    on_stream_lost is called when the kubelet ends its ListAndWatch stream while we serve:
    the kubelet never reopens it by itself, so the owner must register again. The kubelet's
    stream is the first one opened after `expect_kubelet()` (called as we register): any
    other client (a probe, grpcurl) may open and close streams without consequence.
    """

    def __init__(
        self,
        resource: Resource,
        plugin_dir: Path,
        *,
        on_stream_lost: Callable[[str], None] = lambda _name: None,
        telemetry: Telemetry | None = None,
        before_preferred: Callable[[], Awaitable[None]] | None = None,
        withheld: Withheld | None = None,
        flags: Callable[[], Flags] = lambda: DEFAULT_FLAGS,
    ) -> None:
        self.resource = resource
        self.withheld = withheld  # devices not to advertise now (held through DRA)
        self.flags = flags  # how Allocate names devices to the container runtime
        # Facts to gather (pod-resources) before a preferred answer, which is computed
        # without awaiting anything.
        self.before_preferred = before_preferred
        self.socket_path = plugin_dir / socket_name(resource.name)
        self._on_stream_lost = on_stream_lost
        self._telemetry = telemetry or NoTelemetry()
        self._socket = UnixServer(self.socket_path, self._add_servicer)
        self._closing = asyncio.Event()
        self._streams = 0
        self._expecting_kubelet = False
        self._swaps = Versioned()  # the resource replaced
        self._frozen: asyncio.Event | None = None  # streams of this serving send no more

    @property
    def serving(self) -> bool:
        return self._socket.serving

    def _add_servicer(self, server: grpc.aio.Server) -> None:
        pb_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)

    @property
    def open_streams(self) -> int:
        return self._streams

    @property
    def frozen(self) -> bool:
        """Whether this serving's streams were told to send no more (see replace_resource)."""
        return self._frozen is self._closing

    def expect_kubelet(self, expecting: bool = True) -> None:
        """The next stream opened is the kubelet's: we are registering (or stop expecting)."""
        self._expecting_kubelet = expecting

    def replace_resource(self, resource: Resource, *, streams_follow: bool = True) -> None:
        """Serve `resource` (same name) from now on. Open streams follow its inventory, or
        (streams_follow=False, for a resource that registers anew) send nothing more."""
        if resource.name != self.resource.name:
            raise ValueError(f"{resource.name} cannot replace {self.resource.name}")
        self.resource = resource
        if not streams_follow:
            self._frozen = self._closing
        self._swaps.bump()

    def socket_present(self) -> bool:
        """True while our own socket file (not a stale or foreign one) is in place."""
        return self._socket.present()

    async def start(self) -> None:
        """Serve on a fresh socket (agents/kernel/socket_server.py); returns once it answers."""
        self._closing = asyncio.Event()
        await self._socket.start()
        log.info("plugin_serving", resource=self.resource.name, socket=str(self.socket_path))

    async def stop(self, grace: float = GRACE_S) -> None:
        """End open streams, stop serving and remove our socket. Safe to call twice."""
        self._closing.set()
        await self._socket.stop(grace)

    async def restart(self) -> None:
        await self.stop()
        await self.start()

    async def stream(self) -> AsyncIterator[pb.ListAndWatchResponse]:
        """The ListAndWatch stream: the full list now, then on every change."""
        closing = self._closing
        kubelet, self._expecting_kubelet = self._expecting_kubelet, False
        self._streams += 1
        inventory, sent = self.resource.inventory, -1
        listed: tuple[Device, ...] | None = None
        withheld = self.withheld
        held = withheld.version if withheld is not None else 0
        try:
            while not closing.is_set():
                if self._frozen is closing:  # (self.frozen, for this stream's serving)
                    await closing.wait()  # a new registration is coming: it brings the list
                    break
                if inventory is not self.resource.inventory:
                    # A resource rebuilt on reload: the same list is no news. The kubelet
                    # would write its checkpoint for it, which reads as a container's end.
                    inventory = self.resource.inventory
                    sent = inventory.version if self.visible(inventory) == listed else -1
                if inventory.version != sent or (withheld is not None and withheld.version != held):
                    visible = self.visible(inventory)
                    held = withheld.version if withheld is not None else 0
                    if sent != -1 and visible == listed:
                        sent = inventory.version  # a change of what is withheld, not here
                        continue
                    sent, listed = inventory.version, visible
                    yield wire.list_message(listed)
                    continue
                waits = [
                    inventory.wait_newer(sent),
                    closing.wait(),
                    self._swaps.wait_newer(self._swaps.version),
                ]
                if withheld is not None:
                    waits.append(withheld.wait_newer(held))
                await first(*waits)
        except asyncio.CancelledError:
            if closing.is_set():
                raise
            if kubelet:
                log.warning("list_and_watch_cancelled", resource=self.resource.name)
                self._on_stream_lost(self.resource.name)
            else:
                log.info("list_and_watch_ended", resource=self.resource.name, client="other")
            raise
        finally:
            self._streams -= 1

    def visible(self, inventory: Inventory) -> tuple[Device, ...]:
        """The devices to list, as the kubelet sees them: all but those held through the
        other API, and Degraded only where that is Unhealthy (a list that differs in no
        more is no news to the kubelet)."""
        withheld, resource = self.withheld, self.resource
        return tuple(
            replace(d, degraded=False) if d.degraded else d
            for d in inventory.devices
            if withheld is None or not withheld.holds(resource.name, resource.physical_id(d.id))
        )

    def check_not_withheld(self, ids: Sequence[str]) -> None:
        withheld = self.withheld
        if withheld is None:
            return
        resource = self.resource
        for device_id in ids:
            if withheld.holds(resource.name, resource.physical_id(device_id)):
                raise AllocationError(
                    Code.INVALID_ARGUMENT,
                    f"device {device_id} of {self.resource.name} is held by a DRA claim",
                )

    async def observed(self, method: str, call: Callable[[], Awaitable[T]], context: Any) -> T:
        """Run one unary RPC: map AllocationError to its status, never let others escape."""
        started = time.perf_counter()
        code = "OK"
        try:
            return await call()
        except AllocationError as exc:
            code = exc.code.value
            log.warning(
                "request_refused", resource=self.resource.name, method=method, error=str(exc)
            )
            await context.abort(_CODES[exc.code], str(exc))
            raise  # abort raises; this keeps the type checker honest
        except Exception as exc:
            if isinstance(exc, asyncio.CancelledError | grpc.aio.AbortError):
                raise
            code = "INTERNAL"
            log.exception("request_failed", resource=self.resource.name, method=method)
            await context.abort(grpc.StatusCode.INTERNAL, f"{method} failed: {exc}")
            raise
        finally:
            self._telemetry.rpc_done(
                self.resource.name, method, time.perf_counter() - started, code
            )


class _Servicer(pb_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, server: DevicePluginServer) -> None:
        self._server = server
        # Wire messages of the edits a resource gives again (the same object for the same
        # devices), by the edits' identity: the edits and flags kept so each stays unique.
        self._messages: dict[int, tuple[ContainerEdits, Flags, pb.ContainerAllocateResponse]] = {}

    def _message(self, edits: ContainerEdits) -> pb.ContainerAllocateResponse:
        flags = self._server.flags()
        kept = self._messages.get(id(edits))
        if kept is not None and kept[0] is edits and kept[1] is flags:
            return kept[2]
        message = wire.allocation_message(edits, flags)
        if wire.names_afresh(edits, flags):
            return message
        if len(self._messages) >= MESSAGES_KEPT:
            self._messages.clear()
        self._messages[id(edits)] = (edits, flags, message)
        return message

    @property
    def _resource(self) -> Resource:
        return self._server.resource

    async def GetDevicePluginOptions(self, request: pb.Empty, context: Any) -> Any:
        return pb.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=True
        )

    async def ListAndWatch(self, request: pb.Empty, context: Any) -> AsyncIterator[Any]:
        async for message in self._server.stream():
            yield message

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        async def call() -> pb.PreferredAllocationResponse:
            if self._server.before_preferred is not None:
                await self._server.before_preferred()
            return pb.PreferredAllocationResponse(
                container_responses=[self._prefer(req) for req in request.container_requests]
            )

        return await self._server.observed("GetPreferredAllocation", call, context)

    def _prefer(self, req: Any) -> pb.ContainerPreferredAllocationResponse:
        available = list(req.available_deviceIDs)
        must = list(req.must_include_deviceIDs)
        size = int(req.allocation_size)
        resource = self._resource
        requests.check_preferred(resource.inventory, available, must, size, resource.name)
        self._server.check_not_withheld([*available, *must])
        answer = resource.preferred(available, must, size)
        if not requests.check_answer(answer, available, must, size):
            log.error("preferred_answer_invalid", resource=resource.name, answer=answer)
            answer = must + [d for d in available if d not in must][: size - len(must)]
        return pb.ContainerPreferredAllocationResponse(deviceIDs=answer)

    async def Allocate(self, request: Any, context: Any) -> Any:
        async def call() -> pb.AllocateResponse:
            responses = []
            resource = self._resource
            for req in request.container_requests:
                ids = list(req.devicesIDs)
                requests.check_allocate(resource.inventory, ids, resource.name)
                self._server.check_not_withheld(ids)
                responses.append(self._message(resource.allocate(ids)))
                # Debug, not info: a line per container cost half the handler's time; the
                # metrics count allocations, and the kubelet logs them.
                log.debug("allocated", resource=resource.name, devices=ids)
                self._server._telemetry.allocated(resource.name, len(ids))
            return pb.AllocateResponse(container_responses=responses)

        return await self._server.observed("Allocate", call, context)

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        return pb.PreStartContainerResponse()
