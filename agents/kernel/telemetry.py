"""What the runtime and the families report for metrics; a no-op unless metrics are on."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from agents.core.health import DeviceHealth


class Telemetry(Protocol):
    def rpc_done(self, resource: str, method: str, seconds: float, code: str) -> None: ...

    def allocated(self, resource: str, devices: int) -> None: ...

    def registered(self, resource: str) -> None: ...

    def health_event(self, change: DeviceHealth) -> None:
        """A device's grade changed."""
        ...

    def device_health(self, state: DeviceHealth) -> None:
        """A device's health differs from the last one published: grade, cause or the
        figures of its signals."""
        ...

    def readings(self, resource: str, device: str, values: Mapping[str, float | None]) -> None:
        """One probe's readings of a device's signals, by reading name (agents/metrics.py
        READINGS); None: not offered."""
        ...

    def xid(self, resource: str, device: str, xid: int) -> None:
        """An XID NVML delivered for a GPU, whatever it did to the GPU's health."""
        ...


class NoTelemetry:
    def rpc_done(self, resource: str, method: str, seconds: float, code: str) -> None:
        pass

    def allocated(self, resource: str, devices: int) -> None:
        pass

    def registered(self, resource: str) -> None:
        pass

    def health_event(self, change: DeviceHealth) -> None:
        pass

    def device_health(self, state: DeviceHealth) -> None:
        pass

    def readings(self, resource: str, device: str, values: Mapping[str, float | None]) -> None:
        pass

    def xid(self, resource: str, device: str, xid: int) -> None:
        pass
