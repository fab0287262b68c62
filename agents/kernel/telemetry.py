"""What the runtime and the families report for metrics; a no-op unless metrics are on."""

from __future__ import annotations

from typing import Protocol

from agents.core.health import DeviceHealth


class Telemetry(Protocol):
    def rpc_done(self, resource: str, method: str, seconds: float, code: str) -> None: ...

    def allocated(self, resource: str, devices: int) -> None: ...

    def registered(self, resource: str) -> None: ...

    def health_event(self, change: DeviceHealth) -> None: ...


class NoTelemetry:
    def rpc_done(self, resource: str, method: str, seconds: float, code: str) -> None:
        pass

    def allocated(self, resource: str, devices: int) -> None:
        pass

    def registered(self, resource: str) -> None:
        pass

    def health_event(self, change: DeviceHealth) -> None:
        pass
