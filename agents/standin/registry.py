"""The kubelet's side of Register and ListAndWatch: endpoints, streams and device lists."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog

from agents.api import api_pb2

from .endpoint import PluginEndpoint, PluginError
from .resources import DeviceState, PluginOptions, Registration, ResourceView

log = structlog.get_logger()

SUPPORTED_VERSIONS = ("v1beta1",)


@dataclass(frozen=True)
class RegistryPolicy:
    """Timings and faithfulness switches of the registry (see Kubelet)."""

    dial_timeout: float
    grace_period: float
    stale_stream_bug: bool


class PluginRegistry:
    """Registered plugins by resource name; calls `changed` after every change it sees."""

    def __init__(
        self,
        plugin_dir: Path,
        policy: RegistryPolicy,
        clock: Callable[[], float],
        changed: Callable[[], None],
        devices_changed: Callable[[], None],
    ) -> None:
        self._dir = plugin_dir
        self._policy = policy
        self._clock = clock
        self._changed = changed
        self._devices_changed = devices_changed
        self.registrations: list[Registration] = []
        self.views: dict[str, ResourceView] = {}
        self.endpoints: dict[str, PluginEndpoint] = {}
        self._streams: dict[PluginEndpoint, asyncio.Task[None]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    async def on_register(self, request: Any, context: Any) -> Any:
        """The Registration.Register handler."""
        name, version, endpoint = request.resource_name, request.version, request.endpoint
        received = self._clock()
        error = _validate(name, version)
        if error is None:
            error = await self._connect(name, endpoint)
        self.registrations.append(Registration(name, endpoint, version, received, error))
        self._changed()
        if error is not None:
            log.warning("registration_refused", resource=name, endpoint=endpoint, error=error)
            # The kubelet answers a plain Go error, which gRPC sends as UNKNOWN.
            await context.abort(grpc.StatusCode.UNKNOWN, error)
        options = _describe_options(self.views[name].options)
        log.info("plugin_registered", resource=name, endpoint=endpoint, options=options)
        return api_pb2.Empty()

    async def close_all(self) -> None:
        """Cancel every stream, as a kubelet that exits; the devices turn Unhealthy."""
        endpoints = set(self.endpoints.values()) | set(self._streams)
        self.endpoints.clear()
        for endpoint in endpoints:
            await self._close(endpoint)
        if self._closing:
            await asyncio.wait(self._closing)
        now = self._clock()
        for view in self.views.values():
            if view.connected:
                view.mark_unhealthy(now)

    def restore(self) -> None:
        """A starting kubelet knows its resources from the checkpoint but no devices yet."""
        now = self._clock()
        for view in self.views.values():
            view.devices = {}
            view.connected = False
            view.disconnected_at = now

    def current_views(self) -> dict[str, ResourceView]:
        """Like GetCapacity: a resource disconnected past the grace period is dropped."""
        now = self._clock()
        for name, view in list(self.views.items()):
            gone = view.disconnected_at
            if gone is not None and now - gone > self._policy.grace_period:
                del self.views[name]
                self.endpoints.pop(name, None)
                log.info("resource_dropped", resource=name)
                self._devices_changed()
        return dict(self.views)

    async def _connect(self, name: str, socket_name: str) -> str | None:
        try:
            endpoint = await PluginEndpoint.connect(
                name, self._dir / socket_name, self._policy.dial_timeout
            )
        except PluginError as err:
            return str(err)
        old = self.endpoints.get(name)
        self.endpoints[name] = endpoint
        view = self.views.setdefault(name, ResourceView(name, socket_name))
        view.endpoint, view.options = socket_name, endpoint.options
        view.connected, view.disconnected_at = True, None
        if old is not None and not self._policy.stale_stream_bug:
            await self._close(old)
        self._streams[endpoint] = asyncio.create_task(
            self._watch(endpoint), name=f"ListAndWatch {name}"
        )
        return None

    async def _watch(self, endpoint: PluginEndpoint) -> None:
        reason = "stream ended"
        try:
            async for devices in endpoint.list_and_watch():
                self._update(endpoint, devices)
        except PluginError as err:
            code = err.code.name if err.code is not None else "ERROR"
            reason = f"{code}: {err.details}"
        finally:
            self._streams.pop(endpoint, None)
            self._stream_ended(endpoint, reason)
        # Only reached when the plugin ended the stream: the kubelet never dials again.
        await endpoint.close()

    def _update(self, endpoint: PluginEndpoint, devices: dict[str, DeviceState]) -> None:
        current = self.endpoints.get(endpoint.resource)
        view = self.views.get(endpoint.resource)
        if view is None or (current is not endpoint and not self._policy.stale_stream_bug):
            return
        before, view.devices = view.devices, devices
        view.updates += 1
        if devices != before:
            log.info("devices_changed", resource=endpoint.resource, **_diff(before, devices))
        self._devices_changed()
        self._changed()

    def _stream_ended(self, endpoint: PluginEndpoint, reason: str) -> None:
        name = endpoint.resource
        current = self.endpoints.get(name)
        if current is endpoint:
            self._disconnect(name, reason)
        elif current is not None and self._policy.stale_stream_bug:
            # The kubelet disconnects whatever client the name maps to now: the new one.
            del self.endpoints[name]
            self._disconnect(name, f"an old stream ended ({reason})")
            closing = asyncio.create_task(self._close(current))
            self._closing.add(closing)
            closing.add_done_callback(self._closing.discard)
        self._changed()

    def _disconnect(self, name: str, reason: str) -> None:
        view = self.views.get(name)
        if view is not None:
            view.mark_unhealthy(self._clock())
        log.warning("plugin_disconnected", resource=name, reason=reason)

    async def _close(self, endpoint: PluginEndpoint) -> None:
        task = self._streams.pop(endpoint, None)
        await endpoint.close()
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            # wait() rather than await: the stream's cancellation is not ours to re-raise.
            await asyncio.wait([task])


def _validate(name: str, version: str) -> str | None:
    if version not in SUPPORTED_VERSIONS:
        return (
            f"requested API version {version!r} is not supported by kubelet. "
            f"Supported versions are {list(SUPPORTED_VERSIONS)}"
        )
    domain, slash, rest = name.partition("/")
    # Only extended resources, outside the kubernetes.io namespace, come from plugins.
    if not slash or not domain or not rest or domain.endswith("kubernetes.io"):
        return f"the ResourceName {name!r} is invalid"
    return None


def _describe_options(options: PluginOptions) -> str:
    flags = [key for key, on in vars(options).items() if on]
    return ",".join(flags) or "none"


def _diff(before: Mapping[str, DeviceState], after: Mapping[str, DeviceState]) -> dict[str, Any]:
    changed = sorted(d for d in after.keys() & before.keys() if after[d] != before[d])
    return {
        "healthy": sum(state.healthy for state in after.values()),
        "total": len(after),
        "added": sorted(after.keys() - before.keys()),
        "removed": sorted(before.keys() - after.keys()),
        "changed": [f"{d}={after[d].health}" for d in changed],
    }
