"""The real Nvml: the driver's libnvidia-ml through pynvml, errors become BackendError."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pynvml
import structlog

from agents.core.gfd_facts import Fabric
from agents.core.gpu_signals import GpuReading
from agents.errors import BackendError
from agents.hw.nvml import (
    COMPUTE_MODES,
    GpuInfo,
    GpuProcess,
    GpuStatus,
    XidEvent,
    cuda_version_text,
)
from agents.hw.nvml_events import NvmlEvents
from agents.hw.nvml_processes import running_processes
from agents.hw.nvml_query import ODD_ANSWERS, GpuReader, code, fabric_info, text, translated
from agents.hw.nvml_signals import SignalReader

log = structlog.get_logger(__name__)

_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
_SHUTDOWN_WAIT_S = 1.0  # how long shutdown() waits for a hung event wait to let go
XID_DOUBLE_BIT_ECC = 48  # what NVML reports for an uncorrectable ECC error


class NvmlBackend:
    """Nvml over the driver's libnvidia-ml, through pynvml (or `lib`, a stand-in with its
    interface). pynvml errors become BackendError, or a GpuStatus that says what failed.

    init() and shutdown() pair up as NVML's own do (NVML counts them). XID events arrive
    through an NVML event set waited on by one long-lived thread (agents.hw.nvml_events);
    the last shutdown() ends it, and waits for it never long when it hangs.
    """

    def __init__(self, lib: Any = pynvml) -> None:
        self._lib = lib
        self._reader = GpuReader(lib)
        self._signals = SignalReader(lib)
        self._inits = 0
        self._known: set[str] = set()  # UUIDs listed once: NOT_FOUND later means lost
        self._lost: set[str] = set()  # seen lost: answering again means it was reset
        self._ecc: dict[str, int] = {}  # volatile uncorrectable ECC count at the last probe
        self._events = NvmlEvents(lib, self._known)

    def init(self) -> None:
        try:
            self._lib.nvmlInit()
        except ODD_ANSWERS as exc:
            raise BackendError(f"NVML unavailable: {exc}") from exc
        self._inits += 1

    def shutdown(self) -> None:
        if self._inits == 0:
            return
        self._inits -= 1
        if self._inits == 0 and not self._events.close(_SHUTDOWN_WAIT_S):
            # An event wait hangs in the driver: NVML cannot be shut down under it.
            log.warning("nvml_shutdown_skipped", reason="an event wait does not return")
            return
        try:
            self._lib.nvmlShutdown()
        except ODD_ANSWERS as exc:
            raise BackendError(f"NVML shutdown failed: {exc}") from exc

    def driver_version(self) -> str:
        with translated("reading the driver version"):
            return text(self._lib.nvmlSystemGetDriverVersion())

    def cuda_driver_version(self) -> str:
        with translated("reading the CUDA driver version"):
            return cuda_version_text(int(self._lib.nvmlSystemGetCudaDriverVersion()))

    def gpus(self) -> Sequence[GpuInfo]:
        """Every GPU NVML lists; one whose UUID NVML will not give is left out."""
        with translated("counting GPUs"):
            count = int(self._lib.nvmlDeviceGetCount())
        gpus = [info for i in range(count) if (info := self._reader.info(i)) is not None]
        self._known.update(gpu.uuid for gpu in gpus)
        return gpus

    def status(self, uuid: str) -> GpuStatus:
        if self._inits == 0:
            raise BackendError("NVML status: not initialised")
        try:
            handle = self._handle(uuid)
            self._lib.nvmlDeviceGetMemoryInfo(handle)  # touches the GPU: fails when it is lost
        except ODD_ANSWERS as exc:
            return self._failed_status(uuid, exc)
        if uuid in self._lost:
            self._lost.discard(uuid)
            self._events.stale = True  # a reset GPU needs its events registered again
            self._signals.forget(uuid)
        return GpuStatus(lost=False, xids=self._ecc_xids(uuid, handle))

    def probe(self, uuid: str) -> GpuReading:
        """The GPU's degraded-device signals (agents.hw.nvml.GpuProbe)."""
        if self._inits == 0:
            raise BackendError("NVML probe: not initialised")
        with translated(f"probe of {uuid}"):
            handle = self._handle(uuid)
        return self._signals.reading(handle, uuid)

    def fabric(self, uuid: str) -> Fabric | None:
        """The GPU's NVLink fabric (agents.hw.nvml.GpuFabrics)."""
        if self._inits == 0:
            raise BackendError("NVML fabric: not initialised")
        with translated(f"fabric info of {uuid}"):
            return fabric_info(self._lib, self._handle(uuid))

    def processes(self, uuid: str) -> tuple[GpuProcess, ...]:
        """The GPU's running processes (agents.hw.nvml.GpuProcesses)."""
        if self._inits == 0:
            raise BackendError("NVML processes: not initialised")
        with translated(f"running processes of {uuid}"):
            return running_processes(self._lib, self._handle(uuid))

    def compute_mode(self, uuid: str) -> str:
        with translated(f"compute mode of {uuid}"):
            value = int(self._lib.nvmlDeviceGetComputeMode(self._handle(uuid)))
        return COMPUTE_MODES.get(value, str(value))

    def set_compute_mode(self, uuid: str, mode: str) -> None:
        value = next((v for v, name in COMPUTE_MODES.items() if name == mode), None)
        if value is None:
            raise BackendError(f"NVML set compute mode of {uuid}: no mode {mode!r}")
        with translated(f"set compute mode of {uuid}"):
            self._lib.nvmlDeviceSetComputeMode(self._handle(uuid), value)

    def _handle(self, uuid: str) -> Any:
        """The handle listed for this GPU: a lookup by UUID searches the GPUs in turn and
        answers GPU_IS_LOST when any of them fell off the bus, not only this one."""
        handle = self._reader.handles.get(uuid)
        return handle if handle is not None else self._lib.nvmlDeviceGetHandleByUUID(uuid)

    def _failed_status(self, uuid: str, exc: BaseException) -> GpuStatus:
        failure = code(exc)
        if failure == pynvml.NVML_ERROR_NOT_FOUND and uuid not in self._known:
            raise BackendError(f"NVML status of {uuid}: no such GPU") from exc
        if failure in (_LOST, pynvml.NVML_ERROR_NOT_FOUND):
            self._lost.add(uuid)
            return GpuStatus(lost=True)
        if failure == _NOT_SUPPORTED:
            return GpuStatus(lost=False)  # it answered: this GPU has no such counter
        return GpuStatus(lost=False, error=str(exc) or type(exc).__name__)

    def _ecc_xids(self, uuid: str, handle: object) -> tuple[int, ...]:
        """An uncorrectable ECC error counted since the last probe, as the XID NVML gives
        it (48), also where the driver delivers no event for it."""
        try:
            count = int(
                self._lib.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
                )
            )
        except ODD_ANSWERS:
            return ()  # no ECC on this GPU, or not readable now: the next probe tries again
        before = self._ecc.get(uuid)
        self._ecc[uuid] = count
        return (XID_DOUBLE_BIT_ECC,) if before is not None and count > before else ()

    def answered_at(self) -> float | None:
        """When every GPU last answered the event thread's touch (agents.hw.nvml.GpuTouches)."""
        return self._events.answered_at

    async def next_events(self, timeout_s: float) -> list[XidEvent]:
        if self._inits == 0:
            raise BackendError("NVML events: not initialised")
        events: list[XidEvent] = []
        for uuid, data in await self._events.wait(timeout_s):
            if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                log.debug("nvml_ecc_event", event_type=int(data.eventType))
                continue
            if uuid is not None:
                events.append(XidEvent(uuid, int(data.eventData)))
        return events
