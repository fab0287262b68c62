"""NVML answered from a node file: the simulated twin of the real NVML backend.

It speaks as NVML does (PCI bus IDs in NVML's form, XID 79 for a GPU that fell off the bus,
the NVSwitch sentinel for NVLinks that end at a switch) and misbehaves as the node file
says (`nvml: {hang, error}`): a hung call blocks its thread, as the driver's does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter
from collections.abc import Sequence

from agents.core.gfd_facts import Fabric
from agents.core.gpu_signals import GpuReading
from agents.core.mig import gi_profile
from agents.core.pci import nvml_bus_id
from agents.errors import BackendError
from agents.hw.nvml import (
    COMPUTE_MODES,
    NVLINK_REMOTE_GPU,
    NVLINK_REMOTE_NVSWITCH,
    NVSWITCH_BUS_ID,
    GpuInfo,
    GpuProcess,
    GpuStatus,
    MigEngines,
    MigInstance,
    NvLink,
    XidEvent,
    nvlink_ends,
)
from agents.sim.specs import GpuSpec, NodeSpec
from agents.tasks import off_loop

XID_FALLEN_OFF_BUS = 79
DRIVER_VERSION = "550.54.15"
CUDA_DRIVER_VERSION = "12.4"  # what driver 550 answers
# What NVML answers for a model, by a word of its name: (architecture, compute capability,
# streaming multiprocessors per MIG compute slice); brand: NVML_BRAND_NVIDIA for all.
MODELS = (
    ("A100", "Ampere", "8.0", 14),
    ("H100", "Hopper", "9.0", 16),
    ("H200", "Hopper", "9.0", 16),
    ("B200", "Blackwell", "10.0", 20),
    ("B300", "Blackwell", "10.3", 20),
    ("L40S", "Ada Lovelace", "8.9", 0),
    ("T4", "Turing", "7.5", 0),
)
_UNKNOWN_MODEL = ("", "Hopper", "9.0", 16)  # a node file's own model name: an H100's
BRAND = "Nvidia"
# Engines of a MIG instance by compute slices (copy, decoders, JPEG, OFA), as the driver
# gives them on A100 and H100; +me profiles add a decoder, a JPEG and an OFA engine.
_MIG_ENGINES = {1: (1, 0, 0, 0), 2: (2, 1, 0, 0), 3: (3, 2, 0, 0), 4: (4, 2, 0, 0), 7: (7, 5, 1, 1)}
NVSWITCH_LINKS = 18  # an H100 SXM's NVLinks, all to the NVSwitches of an HGX board
# The PCIe generation a model's link trains at, by a word of its name (x16 for all).
PCIE_GENS = {"A100": 4, "L40S": 4, "T4": 3}
PCIE_GEN = 5  # H100, H200, B200, GB200, GB300 and a node file's own model name
PCIE_WIDTH = 16
_NO_ROW_REMAPPING = ("Turing",)  # row remapping came with Ampere
_ANSWERED = "NotSupported"  # an error name that still means the GPU answered


class SimNvml:
    """Implements agents.hw.nvml.Nvml for a simulated node; `update(node)` on reloads.

    XIDs in the file when it is loaded are delivered as events at the first wait. Each
    GPU's compute mode is remembered (DEFAULT at start, as after a boot); `privileged`
    False answers a set as NVML answers a caller that is not root."""

    def __init__(self, node: NodeSpec, *, privileged: bool = True) -> None:
        self._node = node
        self._privileged = privileged
        self.compute_modes: dict[str, str] = {}  # UUID -> mode, of the GPUs ever set
        self._pending: list[XidEvent] = [XidEvent(g.uuid, x) for g in node.gpus for x in g.xids]
        self._changed = asyncio.Event()
        self._refs = 0
        self._known = {g.uuid for g in node.gpus}

    def init(self) -> None:
        self._refs += 1

    def shutdown(self) -> None:
        self._refs = max(self._refs - 1, 0)

    @property
    def inits(self) -> int:
        """Initialisations not yet shut down, as NVML counts them."""
        return self._refs

    def driver_version(self) -> str:
        self._require_init()
        return DRIVER_VERSION

    def cuda_driver_version(self) -> str:
        self._require_init()
        return CUDA_DRIVER_VERSION

    def gpus(self) -> Sequence[GpuInfo]:
        self._require_init()
        node = self._node
        for gpu in node.gpus:
            _hang(gpu)
        # NVML gives no handle for a GPU that is off the bus (GPU_IS_LOST from
        # nvmlDeviceGetHandleByIndex): such a GPU cannot be listed, as on a real node.
        return [
            _info(i, g, node)
            for i, g in enumerate(node.gpus)
            if not (g.lost or g.nvml_error == "GpuIsLost")
        ]

    def status(self, uuid: str) -> GpuStatus:
        gpu = self._after_hang(uuid)
        if gpu is None and uuid in self._known:
            return GpuStatus(lost=True, gone=True)  # taken off the node
        if gpu is None:
            raise BackendError(f"NVML: no GPU with UUID {uuid}")
        if gpu.lost or gpu.nvml_error == "GpuIsLost":
            return GpuStatus(lost=True)
        if gpu.nvml_error not in (None, _ANSWERED):
            return GpuStatus(lost=False, error=gpu.nvml_error)
        return GpuStatus(lost=False)

    def probe(self, uuid: str) -> GpuReading:
        """The degraded-device signals of the node file (agents.hw.nvml.GpuProbe)."""
        gpu = self._asked(uuid, "probe")
        if gpu.nvml_error == _ANSWERED:
            return GpuReading()  # every query answers NOT_SUPPORTED
        return reading(gpu, len(_links(gpu, self._node)))

    def fabric(self, uuid: str) -> Fabric | None:
        """The node file's `fabric` of the GPU (agents.hw.nvml.GpuFabrics)."""
        gpu = self._asked(uuid, "fabric info")
        return None if gpu.nvml_error == _ANSWERED else gpu.fabric

    def processes(self, uuid: str) -> tuple[GpuProcess, ...]:
        """The node file's `processes` of the GPU (agents.hw.nvml.GpuProcesses)."""
        gpu = self._asked(uuid, "running processes")
        if gpu.nvml_error == _ANSWERED:
            raise BackendError(f"NVML running processes of {uuid}: {_ANSWERED}")
        return tuple(GpuProcess(p.pid, p.used_memory_mib * 2**20) for p in gpu.processes)

    def compute_mode(self, uuid: str) -> str:
        self._asked(uuid, "compute mode")
        return self.compute_modes.get(uuid, "DEFAULT")

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        if mode not in COMPUTE_MODES.values():
            raise BackendError(f"NVML set compute mode of {uuid}: no mode {mode!r}")
        self._asked(uuid, "set compute mode")
        if not self._privileged:
            raise BackendError(f"NVML set compute mode of {uuid}: Insufficient Permissions")
        self.compute_modes[uuid] = mode

    def _after_hang(self, uuid: str) -> GpuSpec | None:
        """The GPU as the node file has it when a call about it returns (after its hang)."""
        self._require_init()
        gpu = self._node.gpu(uuid)
        if gpu is not None and gpu.nvml_hang_s:
            _hang(gpu)
            gpu = self._node.gpu(uuid)
        return gpu

    def _asked(self, uuid: str, what: str) -> GpuSpec:
        """The GPU a query `what` about it is answered from; BackendError as NVML fails
        it: an unknown, lost or failing GPU (one that answers NotSupported passes)."""
        gpu = self._after_hang(uuid)
        if gpu is None:
            raise BackendError(f"NVML: no GPU with UUID {uuid}")
        if gpu.lost or gpu.nvml_error == "GpuIsLost":
            raise BackendError(f"NVML {what} of {uuid}: GPU is lost")
        if gpu.nvml_error not in (None, _ANSWERED):
            raise BackendError(f"NVML {what} of {uuid}: {gpu.nvml_error}")
        return gpu

    async def next_events(self, timeout_s: float) -> list[XidEvent]:
        """XIDs appended since the last call; returns early whenever the node changed."""
        self._require_init()
        hang_s = max((g.nvml_hang_s for g in self._node.gpus), default=0.0)
        if hang_s > 0:  # a hung GPU hangs the wait on the event set that holds it
            await off_loop(lambda: time.sleep(hang_s), "sim-nvml-events")
        if not self._pending:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(timeout_s, 0.0)):  # a timer, not a task
                    await self._changed.wait()
        self._changed.clear()
        events, self._pending = self._pending, []
        return events

    def update(self, node: NodeSpec) -> None:
        """Take a reloaded node file: queue its new XIDs and wake next_events()."""
        if node == self._node:
            return
        old = {g.uuid: g for g in self._node.gpus}
        for gpu in node.gpus:
            self._pending.extend(_new_events(old.get(gpu.uuid), gpu))
        self._node = node
        self._known.update(g.uuid for g in node.gpus)
        self._changed.set()

    def _require_init(self) -> None:
        if self._refs <= 0:
            raise BackendError("NVML: not initialized")


def _hang(gpu: GpuSpec) -> None:
    """Blocks the calling thread, as a call into a hung GPU's driver does."""
    if gpu.nvml_hang_s > 0:
        time.sleep(gpu.nvml_hang_s)


def _new_events(old: GpuSpec | None, new: GpuSpec) -> list[XidEvent]:
    before = old.xids if old is not None else ()
    if new.xids[: len(before)] == before:
        added = list(new.xids[len(before) :])
    else:
        added = list((Counter(new.xids) - Counter(before)).elements())
    if new.lost and (old is None or not old.lost):
        added.append(XID_FALLEN_OFF_BUS)
    return [XidEvent(new.uuid, xid) for xid in added]


def reading(gpu: GpuSpec, links: int) -> GpuReading:
    """What NVML answers for the GPU's signals, `links` NVLinks on its board. A MIG-enabled
    GPU has no utilization and no row-remapping answer, as NVML documents."""
    pcie = gpu.pcie
    gen = next((g for word, g in PCIE_GENS.items() if word in gpu.model), PCIE_GEN)
    architecture = model(gpu.model)[1]
    remap = not gpu.mig_enabled and architecture not in _NO_ROW_REMAPPING
    down = min(gpu.nvlinks_down, links)
    events = {"hwSlowdown": 0x8, "hwThermalSlowdown": 0x40, "hwPowerBrake": 0x80}
    t = gpu.telemetry
    return GpuReading(
        pcie_width=pcie.width if pcie.width is not None else PCIE_WIDTH,
        pcie_max_width=pcie.max_width if pcie.max_width is not None else PCIE_WIDTH,
        pcie_gen=pcie.gen if pcie.gen is not None else gen,
        pcie_max_gen=pcie.max_gen if pcie.max_gen is not None else gen,
        utilization=None if gpu.mig_enabled else gpu.utilization,
        pcie_replays=pcie.replays,
        nvlinks=(True,) * (links - down) + (False,) * down if links else None,
        clock_events=sum(events[name] for name in gpu.clock_events),
        remap_pending=gpu.remap_pending if remap else None,
        remap_failed=gpu.remap_failed if remap else None,
        retired_pages_pending=gpu.retired_pages_pending,
        recovery_action=None,  # driver 550 does not offer the field
        memory_used_bytes=min(t.memory_used_mib, gpu.memory_mib) * 2**20,
        memory_total_bytes=gpu.memory_mib * 2**20,
        power_watts=t.power_watts,
        temperature_celsius=t.temperature_celsius,
        sm_clock_mhz=t.sm_clock_mhz,
        fabric=gpu.fabric,
    )


def _links(gpu: GpuSpec, node: NodeSpec) -> list[NvLink]:
    """The GPU's NVLinks, active or down."""
    if node.nvswitch:  # as NVML answers on HGX: every link's far end is a switch port
        return [NvLink(NVLINK_REMOTE_NVSWITCH, NVSWITCH_BUS_ID)] * NVSWITCH_LINKS
    by_uuid = {p: peer for p in gpu.nvlinks if (peer := node.gpu(p)) is not None}
    return [
        NvLink(NVLINK_REMOTE_GPU, nvml_bus_id(by_uuid[p].pci)) for p in gpu.nvlinks if p in by_uuid
    ]


def _info(index: int, gpu: GpuSpec, node: NodeSpec) -> GpuInfo:
    links = _links(gpu, node)
    links = links[: len(links) - min(gpu.nvlinks_down, len(links))]  # down links: not listed
    peers, switch_links = nvlink_ends(links)
    _, architecture, capability, _ = model(gpu.model)
    return GpuInfo(
        index=index,
        uuid=gpu.uuid,
        pci_bus_id=nvml_bus_id(gpu.pci),
        name=gpu.model,
        memory_mib=gpu.memory_mib,
        minor=gpu.minor,
        mig_enabled=gpu.mig_enabled,
        mig_capable=mig_capable(gpu),
        mig_instances=placed(gpu) if gpu.mig_enabled else (),
        nvlink_peers=peers,
        nvswitch_links=switch_links,
        brand=BRAND,
        architecture=architecture,
        compute_capability=gpu.compute_capability or capability,
    )


def mig_capable(gpu: GpuSpec) -> bool:
    """NVML answers a MIG mode for the models that have MIG (and for any GPU the file
    puts in MIG mode)."""
    return gpu.mig_enabled or model(gpu.model)[3] > 0


def model(name: str) -> tuple[str, str, str, int]:
    """MODELS' entry for a GPU model name."""
    return next((m for m in MODELS if m[0] in name), _UNKNOWN_MODEL)


def placed(gpu: GpuSpec) -> tuple[MigInstance, ...]:
    """The node file's MIG instances as NVML describes them: each profile's GPU instance
    profile ID as NVML numbers it, placed in the file's order (each starts where the one
    before it ends), with the engines and memory of its size."""
    sms = model(gpu.model)[3]
    total = gpu.memory_mib * 2**20
    out: list[MigInstance] = []
    start = 0
    for mig in gpu.mig_instances:
        profile_id, size = gi_profile(mig.profile, total)
        slices = int(mig.profile.split("g.")[0].rsplit(".", 1)[-1])
        copy, decoders, jpeg, ofa = _MIG_ENGINES.get(slices, (slices, 0, 0, 0))
        if mig.profile.endswith("+me"):
            decoders, jpeg, ofa = decoders + 1, jpeg + 1, ofa + 1
        engines = MigEngines(
            multiprocessors=sms * slices,
            copy_engines=copy,
            decoders=decoders,
            jpeg_engines=jpeg,
            ofa_engines=ofa,
            memory_mib=gpu.memory_mib * size // 8,
            gi_slices=slices,
            ci_slices=slices,
        )
        out.append(
            dataclasses.replace(
                mig,
                gi_profile_id=profile_id,
                placement_start=start,
                placement_size=size,
                engines=engines,
            )
        )
        start += size
    return tuple(out)
