"""A kubelet stand-in: serves Registration, watches plugins and admits pods as the kubelet does.

Run it alone with `python -m agents.standin.kubelet --device-plugin-dir DIR`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import signal
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import structlog

from agents.api import api_pb2_grpc

from .admission import (
    AdmissionError,
    AllocatedContainer,
    Container,
    DeviceManager,
    Pod,
    PodAllocation,
)
from .checkpoint import CHECKPOINT_NAME
from .endpoint import PluginEndpoint
from .podresources import PodResourcesServer
from .registry import PluginRegistry, RegistryPolicy
from .resources import DeviceState, PluginOptions, Registration, ResourceView

__all__ = [
    "AdmissionError",
    "AllocatedContainer",
    "Container",
    "DeviceState",
    "Kubelet",
    "PluginOptions",
    "Pod",
    "PodAllocation",
    "Registration",
    "ResourceView",
]

log = structlog.get_logger()

KUBELET_SOCKET = "kubelet.sock"
DIAL_TIMEOUT = 10.0  # the kubelet's blocking dial of a registering plugin
STOP_GRACE_PERIOD = 300.0  # a disconnected resource is dropped from the node after this


class Kubelet:
    """The device-plugin side of a kubelet, in-process, for tests, the demo and benchmarks.

    `checkpoint_on_updates` (on by default, as in the kubelet's device manager) also
    renames the checkpoint on every ListAndWatch message and resource drop.
    `pod_resources_socket` serves the pod-resources API there. `stale_stream_bug` keeps the old
    stream on re-registration and lets its end take the new endpoint down (kubernetes
    issues 121994, 127803).
    """

    def __init__(
        self,
        plugin_dir: Path,
        *,
        seed: int | None = None,
        use_preferred: bool = True,
        dial_timeout: float = DIAL_TIMEOUT,
        grace_period: float = STOP_GRACE_PERIOD,
        checkpoint_on_updates: bool = True,
        pod_resources_socket: Path | None = None,
        stale_stream_bug: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plugin_dir = Path(plugin_dir).absolute()
        self._checkpoint_on_updates = checkpoint_on_updates
        self._server: Any = None
        self._changed = asyncio.Event()
        self._devices = DeviceManager(
            self.checkpoint_path, random.Random(seed), use_preferred=use_preferred
        )
        self.pod_resources = (
            PodResourcesServer(pod_resources_socket, self._devices.listed)
            if pod_resources_socket is not None
            else None
        )
        self._plugins = PluginRegistry(
            self.plugin_dir,
            RegistryPolicy(dial_timeout, grace_period, stale_stream_bug),
            clock,
            changed=self._notify,
            devices_changed=self._devices_changed,
        )

    @property
    def registrations(self) -> list[Registration]:
        """Every Register received, accepted or not, in order."""
        return self._plugins.registrations

    @property
    def socket_path(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    @property
    def checkpoint_path(self) -> Path:
        return self.plugin_dir / CHECKPOINT_NAME

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def checkpoint_writes(self) -> int:
        """How many times this kubelet renamed its checkpoint file into place."""
        return self._devices.checkpoint_writes

    # Life cycle

    async def start(self) -> None:
        """Start as the kubelet does: clear the sockets, then serve a fresh kubelet.sock."""
        if self._server is not None:
            raise RuntimeError("the kubelet stand-in is already running")
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self._remove_sockets()
        self._plugins.restore()
        server = grpc.aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(_RegistrationService(self._plugins), server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        await server.start()
        # Only the kubelet's own user may register plugins.
        self.socket_path.chmod(0o600)
        self._server = server
        if self.pod_resources is not None:
            await self.pod_resources.start()
        log.info("kubelet_started", socket=str(self.socket_path))
        self._notify()

    async def stop(self) -> None:
        """The kubelet is gone: no Registration, no streams, no kubelet.sock. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            await server.stop(None)
            self.socket_path.unlink(missing_ok=True)
        if self.pod_resources is not None:
            await self.pod_resources.stop()
        await self._plugins.close_all()
        if server is not None:
            log.info("kubelet_stopped", socket=str(self.socket_path))
        self._notify()

    async def restart(self) -> None:
        """stop() then start(); allocations survive, as in the kubelet's checkpoint."""
        await self.stop()
        await self.start()

    def _remove_sockets(self) -> None:
        for path in sorted(self.plugin_dir.iterdir()):
            if path.name == CHECKPOINT_NAME:
                continue
            try:
                mode = path.stat().st_mode
            except OSError:
                continue
            if stat.S_ISSOCK(mode):
                path.unlink(missing_ok=True)
                log.info("socket_removed", path=str(path))

    # What the node shows

    def resource(self, name: str) -> ResourceView | None:
        """The live view of one resource; read it, do not change it."""
        return self._plugins.views.get(name)

    def resources(self) -> Mapping[str, ResourceView]:
        return dict(self._plugins.views)

    def endpoint(self, name: str) -> PluginEndpoint | None:
        return self._plugins.endpoints.get(name)

    def capacity(self) -> dict[str, int]:
        """Like the node's status: every device of every resource still on the node."""
        return {name: len(view.devices) for name, view in self._plugins.current_views().items()}

    def allocatable(self) -> dict[str, int]:
        return {name: len(view.healthy()) for name, view in self._plugins.current_views().items()}

    # Pods

    async def admit(self, pod: Pod) -> PodAllocation:
        """Admit one pod; raises AdmissionError, and then none of its devices stay held."""
        try:
            return await self._devices.admit(pod, self)
        finally:
            self._notify()

    async def release(self, pod_name: str) -> None:
        """The pod is deleted: free its devices (the kubelet does not rewrite the checkpoint)
        and drop it from pod-resources."""
        if self._devices.release(pod_name):
            log.info("pod_released", pod=pod_name)
        self._notify()

    async def end(self, pod_name: str) -> None:
        """The pod ended but is not deleted: its devices are free, pod-resources still
        lists them (kubernetes issue 119423). `release` deletes it later."""
        if self._devices.release(pod_name, deleted=False):
            log.info("pod_ended", pod=pod_name)
        self._notify()

    def allocated(self) -> dict[str, set[str]]:
        return self._devices.allocated()

    def pod(self, name: str) -> PodAllocation | None:
        return self._devices.pod(name)

    # Waiting

    async def wait_until(
        self,
        predicate: Callable[[Kubelet], bool],
        timeout: float,  # noqa: ASYNC109 (named in the error; the brief's API)
    ) -> None:
        """Return once predicate(self) holds, re-checked on every change; TimeoutError if not."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not predicate(self):
            changed = self._changed
            remaining = deadline - loop.time()
            if remaining <= 0:
                what = getattr(predicate, "__qualname__", repr(predicate))
                raise TimeoutError(
                    f"kubelet stand-in: {what} still false after {timeout}s; {self.summary()}"
                )
            # A timeout here only means: check the predicate one last time.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    def summary(self) -> str:
        """One line of state, for timeouts and logs."""
        parts = [
            f"{name}({'connected' if view.connected else 'disconnected'} "
            f"{len(view.healthy())}/{len(view.devices)} healthy, {view.updates} updates)"
            for name, view in sorted(self._plugins.views.items())
        ]
        return (
            f"running={self.running} registrations={len(self.registrations)} "
            f"resources=[{', '.join(parts)}] allocated={self.allocated()}"
        )

    def _notify(self) -> None:
        # An Event per generation: waiters of the old one wake, later waiters take the new.
        self._changed.set()
        self._changed = asyncio.Event()

    def _devices_changed(self) -> None:
        if self._checkpoint_on_updates:
            self._devices.write_checkpoint(self._plugins.views)


class _RegistrationService:
    """v1beta1.Registration, answered by the registry."""

    def __init__(self, plugins: PluginRegistry) -> None:
        self._plugins = plugins

    async def Register(self, request: Any, context: Any) -> Any:
        return await self._plugins.on_register(request, context)


async def _serve(kubelet: Kubelet) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    await kubelet.start()
    try:
        await stopping.wait()
    finally:
        await kubelet.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m agents.standin.kubelet",
        description="Serve a kubelet stand-in's Registration and log what plugins report.",
    )
    # Required: a kubelet start deletes every socket in the directory.
    parser.add_argument("--device-plugin-dir", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument(
        "--no-preferred", action="store_true", help="never call GetPreferredAllocation"
    )
    parser.add_argument(
        "--pod-resources-socket", type=Path, default=None, help="serve pod-resources here"
    )
    args = parser.parse_args(argv)
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="%H:%M:%S", utc=False),
            structlog.dev.ConsoleRenderer(colors=False),
        ]
    )
    kubelet = Kubelet(
        args.device_plugin_dir,
        seed=args.seed,
        use_preferred=not args.no_preferred,
        pod_resources_socket=args.pod_resources_socket,
    )
    asyncio.run(_serve(kubelet))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
