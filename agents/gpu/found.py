"""What one GPU discovery found, as plain values: the kind makes it off the event loop
(agents/gpu/kind.py), the family is built from it (agents/gpu/family.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from agents.core.gfd_facts import Fabric, VgpuHost
from agents.gpu.discovery import DriverVersions, Gpu
from agents.gpu.mps import MpsDaemons
from agents.gpu.plan import ResourcePlan
from agents.gpu.share_mps import ShareDaemon


@dataclass(frozen=True)
class GpusFound:
    """What one discovery found; `held` says whether it holds an NVML initialisation,
    which the family built from it gives back."""

    gpus: tuple[Gpu, ...]
    plans: tuple[ResourcePlan, ...]
    mig_caps: dict[str, tuple[str, ...]]  # MIG UUID -> its capability devices
    dev_root: str  # "" on a real node
    held: bool
    driver: DriverVersions = field(default_factory=DriverVersions)  # its versions; "" unknown
    # What GFD's labels are read from besides NVML's GPUs (agents/gpu/gfd.py).
    machine: str | None = None  # DMI product name; None: unreadable
    vgpus: tuple[VgpuHost, ...] | None = None  # None: PCI config space unreadable
    fabrics: dict[str, Fabric | None] = field(default_factory=dict)  # by GPU UUID
    imex_channels: tuple[int, ...] = ()  # the configured IMEX channels the node has
    mps: MpsDaemons | None = None  # the MPS-shared resources' control daemons, started
    share_mps: ShareDaemon | None = None  # DRA shares' MPS control daemon: limits enforced
