"""What a family advertises and what a container is given, free of any API's wire form."""

from __future__ import annotations

from dataclasses import dataclass

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
class DeviceNode:
    """A device node the container opens: its path inside, and where it is on the host."""

    container_path: str
    host_path: str
    permissions: str = "rw"


@dataclass(frozen=True)
class Mount:
    """A file or directory of the host mounted into the container."""

    container_path: str
    host_path: str
    read_only: bool = True
