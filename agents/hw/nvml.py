"""The NVML Protocol the GPU family uses and its value types.

The real backend (pynvml) lives in agents.hw.nvml_backend, so that a simulated node
never loads the driver's bindings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class MigInstance:
    uuid: str  # MIG-...
    profile: str  # e.g. "1g.10gb"
    gpu_instance: int  # NVML's GPU instance ID on its GPU
    compute_instance: int  # NVML's compute instance ID within that GPU instance


@dataclass(frozen=True)
class GpuInfo:
    """What discovery needs to know of one GPU, as NVML reports it."""

    index: int
    uuid: str
    pci_bus_id: str  # NVML's form: 00000000:1B:00.0 (8-digit domain, upper case)
    name: str
    memory_mib: int
    minor: int  # /dev/nvidia<minor>
    mig_enabled: bool
    mig_instances: tuple[MigInstance, ...]
    nvlink_peers: tuple[str, ...]  # PCI bus IDs (NVML form) of NVLink peers, one per link


@dataclass(frozen=True)
class XidEvent:
    uuid: str
    xid: int


@dataclass(frozen=True)
class GpuStatus:
    """Level-triggered health of one GPU.

    lost: the GPU fell off the bus (NVML answers GPU_IS_LOST or no longer lists it).
    pending_xids: XIDs delivered for this GPU whose effect has not cleared yet.
    """

    lost: bool
    pending_xids: frozenset[int] = frozenset()


class Nvml(Protocol):
    """NVML as the GPU family sees it. Raises BackendError on failure."""

    def init(self) -> None: ...

    def shutdown(self) -> None: ...

    def driver_version(self) -> str: ...

    def gpus(self) -> Sequence[GpuInfo]: ...

    def status(self, uuid: str) -> GpuStatus: ...

    async def next_events(self, timeout_s: float) -> list[XidEvent]:
        """Wait up to timeout_s for XID events; may return early and empty when the
        device set may have changed (the caller then re-reads gpus())."""
        ...
