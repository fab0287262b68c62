"""What the stand-in kubelet knows of each plugin: registrations, options and device lists."""

from __future__ import annotations

from dataclasses import dataclass, field

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True)
class Registration:
    """One Register call as received; `error` is what the kubelet answered, None if accepted."""

    resource_name: str
    endpoint: str
    version: str
    at: float
    error: str | None = None


@dataclass(frozen=True)
class PluginOptions:
    """The answer of GetDevicePluginOptions (the RegisterRequest's own options are ignored)."""

    pre_start_required: bool = False
    get_preferred_allocation_available: bool = False


@dataclass(frozen=True)
class DeviceState:
    """One device as the last ListAndWatch message described it."""

    health: str
    numa: tuple[int, ...] = ()

    @property
    def healthy(self) -> bool:
        # The kubelet counts anything but the exact string "Healthy" as unhealthy.
        return self.health == HEALTHY


@dataclass
class ResourceView:
    """The kubelet's live state of one resource; read it, do not change it."""

    name: str
    endpoint: str
    options: PluginOptions = field(default_factory=PluginOptions)
    devices: dict[str, DeviceState] = field(default_factory=dict)
    connected: bool = False
    updates: int = 0
    disconnected_at: float | None = None

    def healthy(self) -> set[str]:
        return {device_id for device_id, state in self.devices.items() if state.healthy}

    def mark_unhealthy(self, now: float) -> None:
        self.devices = {
            device_id: DeviceState(UNHEALTHY, state.numa)
            for device_id, state in self.devices.items()
        }
        self.connected = False
        self.disconnected_at = now
