"""The NVML Protocol the GPU family uses and its value types.

The real backend (pynvml) lives in agents.hw.nvml_backend, so that a simulated node
never loads the driver's bindings.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from agents.core.gfd_facts import Fabric
from agents.core.gpu_signals import GpuReading

# NVML's nvmlNvLinkDeviceType_t: what the far end of an NVLink is.
NVLINK_REMOTE_GPU = 0
NVLINK_REMOTE_NVSWITCH = 2
# The remote PCI bus ID NVML answers for a link that ends at an NVSwitch (HGX, NVL72).
NVSWITCH_BUS_ID = "FFFFFFFF:FF:FF.0"


# NVML's nvmlBrandType_t and nvmlDeviceArchitecture_t, by value, as DRA attributes name them.
BRANDS = (
    *("Unknown", "Quadro", "Tesla", "NVS", "Grid", "GeForce", "Titan", "NvidiaVApps"),
    *("NvidiaVPC", "NvidiaVCS", "NvidiaVWS", "NvidiaCloudGaming", "QuadroRTX", "NvidiaRTX"),
    *("Nvidia", "GeForceRTX", "TitanRTX"),
)
ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
}
# NVML's nvmlComputeMode_t by value (1, EXCLUSIVE_THREAD, is no longer supported).
COMPUTE_MODES = {0: "DEFAULT", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}


@dataclass(frozen=True)
class MigEngines:
    """What one MIG instance holds, as NVML reports its attributes."""

    multiprocessors: int = 0
    copy_engines: int = 0
    decoders: int = 0
    encoders: int = 0
    jpeg_engines: int = 0
    ofa_engines: int = 0
    memory_mib: int = 0
    gi_slices: int = 0  # the GPU instance's slices (gpuInstanceSliceCount)
    ci_slices: int = 0  # the compute instance's (computeInstanceSliceCount)


@dataclass(frozen=True)
class MigInstance:
    uuid: str  # MIG-...
    profile: str  # e.g. "1g.10gb"
    gpu_instance: int  # NVML's GPU instance ID on its GPU
    compute_instance: int  # NVML's compute instance ID within that GPU instance
    gi_profile_id: int = 0  # the GPU instance's profile ID (nvmlGpuInstanceInfo_t.profileId)
    placement_start: int = 0  # its placement on the GPU, in memory slices
    placement_size: int = 0
    engines: MigEngines = MigEngines()


@dataclass(frozen=True)
class GpuInfo:
    """What discovery needs to know of one GPU, as NVML reports it. Fields NVML would
    not answer hold their defaults; only the UUID is required."""

    index: int
    uuid: str
    pci_bus_id: str  # NVML's form: 00000000:1B:00.0 (8-digit domain, upper case); "" unknown
    name: str
    memory_mib: int
    minor: int  # /dev/nvidia<minor>
    mig_enabled: bool
    mig_instances: tuple[MigInstance, ...]
    nvlink_peers: tuple[str, ...]  # PCI bus IDs (NVML form) of NVLink peers, one per link
    nvswitch_links: int = 0  # active NVLinks that end at an NVSwitch
    brand: str = ""  # BRANDS' name of NVML's brand: "Nvidia"
    architecture: str = ""  # ARCHITECTURES' name: "Hopper"
    compute_capability: str = ""  # CUDA compute capability: "9.0"
    mig_capable: bool = False  # NVML answers its MIG mode (enabled or not)


@dataclass(frozen=True)
class NvLink:
    """NVML's answer for one active NVLink: the far end's device type and PCI bus ID."""

    remote_type: int | None  # NVLINK_REMOTE_*; None where NVML does not say
    remote_bus_id: str


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version (12040) as the version it names: "12.4"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def nvlink_ends(links: Iterable[NvLink]) -> tuple[tuple[str, ...], int]:
    """The GPU peers (bus IDs, one per link) and the number of links to NVSwitches.

    A link ends at an NVSwitch when NVML says so, or, where it cannot say, when its
    remote bus ID is the sentinel NVML answers for switch ports."""
    peers: list[str] = []
    switch_links = 0
    for link in links:
        bus = link.remote_bus_id.upper()
        if link.remote_type == NVLINK_REMOTE_NVSWITCH or bus == NVSWITCH_BUS_ID:
            switch_links += 1
        elif link.remote_type in (None, NVLINK_REMOTE_GPU) and bus:
            peers.append(bus)
    return tuple(peers), switch_links


@dataclass(frozen=True)
class XidEvent:
    uuid: str
    xid: int


@dataclass(frozen=True)
class GpuStatus:
    """What NVML answered when asked about one GPU just now.

    lost: the GPU fell off the bus (NVML answers GPU_IS_LOST, or no longer lists it).
    error: NVML failed otherwise (e.g. "Unknown"): the GPU cannot be trusted for now.
    hung: the question has not been answered within the hang bound.
    xids: XIDs this probe itself found (an uncorrectable ECC count that grew: 48).
    gone: the GPU was taken off the node (a simulated node's file no longer lists it):
    it is no longer advertised until it is back.
    """

    lost: bool
    error: str | None = None
    hung: bool = False
    xids: tuple[int, ...] = ()
    gone: bool = False

    @property
    def answering(self) -> bool:
        return not (self.lost or self.hung or self.error is not None)


class Nvml(Protocol):
    """NVML as the GPU family sees it. Raises BackendError on failure.

    init(), gpus() and status() block (status() may hang as long as NVML does): the
    family calls them before it serves, or through agents.hw.nvml_calls off the loop."""

    def init(self) -> None: ...

    def shutdown(self) -> None: ...

    def driver_version(self) -> str: ...

    def cuda_driver_version(self) -> str:
        """The CUDA version the driver supports, "12.4"."""
        ...

    def gpus(self) -> Sequence[GpuInfo]: ...

    def status(self, uuid: str) -> GpuStatus: ...

    def compute_mode(self, uuid: str) -> str:
        """The GPU's compute mode, a value of COMPUTE_MODES."""
        ...

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        """Set it (a value of COMPUTE_MODES) until the next reboot; NVML needs root for
        this: BackendError naming NoPermission otherwise."""
        ...

    async def next_events(self, timeout_s: float) -> list[XidEvent]:
        """Wait up to timeout_s for XID events, off the event loop; may return early and
        empty when the device set may have changed (the caller then probes again)."""
        ...


@runtime_checkable
class GpuTouches(Protocol):
    """A backend that touches every GPU between two looks for events (the real one,
    agents.hw.nvml_events), and so knows when every GPU last answered: a probe of a node
    whose GPUs all answer and are all Healthy may then be skipped."""

    def answered_at(self) -> float | None:
        """time.monotonic() at the end of the last round of touches in which every GPU
        NVML lists answered normally; None before one, and while a GPU does not."""
        ...


@runtime_checkable
class GpuProbe(Protocol):
    """The degraded-device signals of a GPU (docs/degraded.md), as NVML answers them.
    Both backends implement it beside Nvml."""

    def probe(self, uuid: str) -> GpuReading:
        """Blocking (call it off the loop): one reading of the GPU's signals, a field None
        where NVML does not offer it; BackendError when the GPU is lost or unknown."""
        ...


@dataclass(frozen=True)
class GpuProcess:
    """One process NVML lists as running on a GPU (a compute process, or an MPS client)."""

    pid: int  # in the host's PID namespace
    used_bytes: int | None  # its GPU memory; None where NVML does not say


@runtime_checkable
class GpuProcesses(Protocol):
    """The processes running on a GPU; both backends implement it beside Nvml."""

    def processes(self, uuid: str) -> tuple[GpuProcess, ...]:
        """Blocking (call it off the loop): NVML's running compute processes and MPS
        clients, one entry per PID. BackendError on any failure."""
        ...


@runtime_checkable
class GpuFabrics(Protocol):
    """The NVLink fabric a GPU registered with (nvmlDeviceGetGpuFabricInfo(V)); both
    backends implement it beside Nvml."""

    def fabric(self, uuid: str) -> Fabric | None:
        """Blocking (call it off the loop): the GPU's fabric; None where NVML answers
        NotSupported (no fabric: PCIe GPUs, drivers before R525). BackendError on any
        other failure."""
        ...
