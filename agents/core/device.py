"""What a family advertises and what Allocate answers, free of any wire format."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"


@dataclass(frozen=True, order=True)
class Device:
    """One advertised device: its kubelet ID, health and NUMA node (None if unknown).

    `healthy` is what the kubelet is told; `degraded` says that the device works but is
    slow or about to fail (docs/degraded.md): still Healthy to the kubelet unless the
    config says otherwise, and chosen last by the preferred allocation."""

    id: str
    healthy: bool = True
    numa: int | None = None
    degraded: bool = False

    @property
    def health(self) -> str:
        return HEALTHY if self.healthy else UNHEALTHY


@dataclass(frozen=True)
class DeviceSpec:
    """A device node passed into the container."""

    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class Mount:
    container_path: str
    host_path: str
    read_only: bool = True


@dataclass(frozen=True)
class ContainerAllocation:
    """Everything one container gets for its devices of one resource."""

    envs: Mapping[str, str] = field(default_factory=dict)
    devices: tuple[DeviceSpec, ...] = ()
    mounts: tuple[Mount, ...] = ()
    annotations: Mapping[str, str] = field(default_factory=dict)
    cdi_devices: tuple[str, ...] = ()
