"""The plain facts GFD v0.20's labels are made from: each GPU as NVML and sysfs describe
it, its MIG devices and NVLink fabric, and the node's sharing and vGPUs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

FABRIC_STATE_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED
_NO_CLUSTER = "00000000-0000-0000-0000-000000000000"


@dataclass(frozen=True)
class MigLabels:
    """One MIG device as GFD reads it (nvmlDeviceGetAttributes of the MIG handle)."""

    profile: str  # go-nvlib's profile name with '+' as '.': "1g.10gb", "1g.10gb.me"
    memory_mib: int = 0
    multiprocessors: int = 0
    gi_slices: int = 0
    ci_slices: int = 0
    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpeg_engines: int = 0
    ofa_engines: int = 0

    def attributes(self) -> dict[str, int]:
        return {
            "memory": self.memory_mib,
            "multiprocessors": self.multiprocessors,
            "slices.gi": self.gi_slices,
            "slices.ci": self.ci_slices,
            "engines.copy": self.copy_engines,
            "engines.decoder": self.decoders,
            "engines.encoder": self.encoders,
            "engines.jpeg": self.jpeg_engines,
            "engines.ofa": self.ofa_engines,
        }


@dataclass(frozen=True)
class Fabric:
    """A GPU's NVLink fabric as nvmlDeviceGetGpuFabricInfo(V) answers it."""

    cluster_uuid: str  # 8-4-4-4-12 lower-case hex
    clique_id: int
    state: int  # NVML_GPU_FABRIC_STATE_*
    status: int  # an nvmlReturn_t: 0 is success
    # NVML_GPU_FABRIC_HEALTH_MASK_* (agents.core.fabric_health); 0: no health reported
    health_mask: int = 0

    @property
    def attached(self) -> bool:
        """go-nvlib's IsFabricAttached: registered, successfully, with a real cluster."""
        return (
            self.state == FABRIC_STATE_COMPLETED
            and self.status == 0
            and self.cluster_uuid != _NO_CLUSTER
        )


@dataclass(frozen=True)
class GpuFacts:
    """What GFD reads of one GPU."""

    name: str
    memory_mib: int
    compute_capability: str = ""  # "9.0"; "" unknown
    mig_capable: bool = False
    mig_enabled: bool = False
    migs: tuple[MigLabels, ...] = ()
    pci_class: int | None = None  # from sysfs; None unreadable
    fabric: Fabric | None = None  # None: NVML answers NotSupported


@dataclass(frozen=True)
class Sharing:
    """The config's sharing as GFD reads it (resource renames ignored, as GFD does)."""

    strategy: str = "none"  # none | time-slicing | mps
    replicas: Mapping[str, int] = field(default_factory=dict)  # resource name -> replicas
    rename_by_default: bool = False


@dataclass(frozen=True)
class VgpuHost:
    """The vGPU host driver a vGPU's PCI vendor capability names."""

    version: str
    branch: str


@dataclass(frozen=True)
class NodeFacts:
    gpus: tuple[GpuFacts, ...]
    driver_version: str = ""  # "550.54.15"; "" unknown
    cuda_driver_version: str = ""  # "12.4"
    machine: str | None = None  # DMI product name; None: the file is unreadable
    vgpus: tuple[VgpuHost, ...] | None = ()  # None: PCI config space unreadable
    mig_strategy: str = "none"
    sharing: Sharing = field(default_factory=Sharing)
