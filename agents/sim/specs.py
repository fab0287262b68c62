"""A simulated node as its file describes it: its GPUs, NICs and NUMA nodes as plain values,
which the simulator's NVML, sysfs tree, links and checks read."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

from agents.core.gfd_facts import Fabric
from agents.hw.lldp import Neighbour
from agents.hw.nvml import MigInstance
from agents.sim.signal_fields import PcieSpec, TelemetrySpec

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
DEFAULT_MEMORY_MIB = 81559


@dataclass(frozen=True)
class SimProcess:
    """A process the simulated NVML lists as running on a GPU (`processes:`)."""

    pid: int
    used_memory_mib: int


@dataclass(frozen=True)
class GpuSpec:
    uuid: str
    pci: str
    upstream: tuple[str, ...] = ()  # bridges, root port first
    numa: int | None = 0
    model: str = DEFAULT_MODEL
    memory_mib: int = DEFAULT_MEMORY_MIB
    minor: int = 0
    nvlinks: tuple[str, ...] = ()  # peer GPU UUIDs
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()
    xids: tuple[int, ...] = ()
    lost: bool = False
    nvml_hang_s: float = 0.0  # every NVML call about this GPU blocks this long
    nvml_error: str | None = None  # every NVML call about this GPU fails so (e.g. "Unknown")
    # Degraded-device signals (docs/degraded.md), all editable while the agent runs.
    pcie: PcieSpec = field(default_factory=PcieSpec)
    utilization: int = 0  # percent
    nvlinks_down: int = 0  # how many of its active NVLinks are down
    clock_events: tuple[str, ...] = ()  # of CLOCK_EVENT_NAMES
    remap_pending: bool = False
    remap_failed: bool = False
    retired_pages_pending: bool = False
    compute_capability: str | None = None  # None: as NVML answers for the model
    fabric: Fabric | None = None  # None: NVML answers NotSupported (no NVLink fabric)
    telemetry: TelemetrySpec = field(default_factory=TelemetrySpec)  # memory, power, ...
    processes: tuple[SimProcess, ...] = ()  # running on it, as NVML lists them


@dataclass(frozen=True)
class NicSpec:
    pci: str
    netdev: str
    upstream: tuple[str, ...] = ()
    numa: int | None = 0
    rdma: str | None = None  # None: a NIC without an RDMA device
    vendor: str = "15b3"
    link_layer: str = "Ethernet"  # Ethernet | InfiniBand
    link: str = "up"  # up | down
    uverbs: int | None = None  # /dev/infiniband/uverbs<N>; None without rdma
    lldp: Neighbour | None = None  # the switch port its LLDP frames name; None: none heard
    speed_mbps: int | None = None  # /sys/class/net/<if>/speed; None: no such file
    counters: tuple[tuple[str, int], ...] = ()  # RDMA error counters present, by name
    carrier_changes: int = 0


@dataclass(frozen=True)
class NodeSpec:
    numa_nodes: int = 1
    gpus: tuple[GpuSpec, ...] = ()
    nics: tuple[NicSpec, ...] = ()
    nvswitch: bool = False  # the GPUs' NVLinks end at NVSwitches (HGX/DGX)
    machine: str | None = None  # DMI product name; None: no /sys/class/dmi/id/product_name
    imex_channels: tuple[int, ...] = ()  # /dev/nvidia-caps-imex-channels/channel<N>
    mps_available: bool = False  # the twin of nvidia-cuda-mps-control is on the root's PATH

    @property
    def devices(self) -> tuple[GpuSpec | NicSpec, ...]:
        """GPUs then NICs."""
        return (*self.gpus, *self.nics)

    def gpu(self, uuid: str) -> GpuSpec | None:
        return self._gpus_by_uuid.get(uuid)

    def nic_by_netdev(self, netdev: str) -> NicSpec | None:
        return self._nics_by_netdev.get(netdev)

    # Looked up for every device on every health probe: indexed once per node.
    @functools.cached_property
    def _gpus_by_uuid(self) -> dict[str, GpuSpec]:
        return {g.uuid: g for g in reversed(self.gpus)}  # the first of duplicates wins

    @functools.cached_property
    def _nics_by_netdev(self) -> dict[str, NicSpec]:
        return {n.netdev: n for n in reversed(self.nics)}
