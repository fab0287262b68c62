"""The real Nvml: the driver's libnvidia-ml through pynvml, errors become BackendError."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pynvml
import structlog

from agents.core.mig import mig_profile_name
from agents.core.xid import PendingXids
from agents.errors import BackendError
from agents.hw.nvml import GpuInfo, GpuStatus, MigInstance, XidEvent

log = structlog.get_logger(__name__)


def _code(exc: Exception) -> int:
    return int(getattr(exc, "value", pynvml.NVML_ERROR_UNKNOWN))


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _bus_id(pci_info: Any) -> str:
    return _text(pci_info.busId).upper()


def _handle_key(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


_WANTED_EVENTS = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)
_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
_WAIT_SLICE_MS = 250  # bounds how long shutdown() waits for an in-flight wait
_DRAIN_MAX = 64


class NvmlBackend:
    """Nvml over the driver's libnvidia-ml, through pynvml. pynvml errors become BackendError.

    init() and shutdown() pair up as NVML's own do (NVML counts them). XID events arrive
    through an NVML event set waited on in a worker thread; the wait is sliced so that the
    last shutdown() never waits long for it.
    """

    def __init__(self, ignored_xids: frozenset[int] = frozenset()) -> None:
        self._xids = PendingXids(ignored_xids)
        self._inits = 0
        self._closing = False
        self._known: set[str] = set()  # UUIDs listed once: NOT_FOUND later means lost
        self._lock = threading.Lock()  # the event set: one waiter, or its release
        self._event_set: Any = None
        self._event_uuids: dict[int, str] = {}
        self._stale_events = False
        self._unregistered: set[int] = set()  # GPU indices without events, logged once

    def init(self) -> None:
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise BackendError(f"NVML unavailable: {exc}") from exc
        self._inits += 1
        self._closing = False

    def shutdown(self) -> None:
        if self._inits == 0:
            return
        self._inits -= 1
        if self._inits == 0:
            self._closing = True
            with self._lock:
                self._free_event_set()
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError as exc:
            raise BackendError(f"NVML shutdown failed: {exc}") from exc

    def driver_version(self) -> str:
        with _translated("reading the driver version"):
            return _text(pynvml.nvmlSystemGetDriverVersion())

    def gpus(self) -> Sequence[GpuInfo]:
        with _translated("listing GPUs"):
            count = int(pynvml.nvmlDeviceGetCount())
            gpus = [_gpu_info(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
        self._known.update(gpu.uuid for gpu in gpus)
        return gpus

    def status(self, uuid: str) -> GpuStatus:
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
            pynvml.nvmlDeviceGetMemoryInfo(handle)  # touches the GPU: fails when it is lost
            lost = False
        except pynvml.NVMLError as exc:
            gone = _code(exc) == pynvml.NVML_ERROR_NOT_FOUND and uuid in self._known
            if _code(exc) != pynvml.NVML_ERROR_GPU_IS_LOST and not gone:
                raise BackendError(f"NVML status of {uuid}: {exc}") from exc
            lost = True
        if self._xids.observe(uuid, lost):
            self._stale_events = True  # a reset GPU needs its events registered again
        return GpuStatus(lost=lost, pending_xids=self._xids.pending(uuid))

    async def next_events(self, timeout_s: float) -> list[XidEvent]:
        if self._inits == 0:
            raise BackendError("NVML events: not initialised")
        raw = await asyncio.to_thread(self._wait, max(0, int(timeout_s * 1000)))
        events: list[XidEvent] = []
        for data in raw:
            if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                log.debug("nvml_ecc_event", event_type=int(data.eventType))
                continue
            uuid = self._event_uuid(data.device)
            if uuid is None:
                continue
            xid = int(data.eventData)
            self._xids.deliver(uuid, xid)
            events.append(XidEvent(uuid=uuid, xid=xid))
        return events

    def _event_uuid(self, handle: Any) -> str | None:
        uuid = self._event_uuids.get(_handle_key(handle))
        if uuid is None:
            with contextlib.suppress(pynvml.NVMLError):
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
        return uuid

    def _wait(self, timeout_ms: int) -> list[Any]:
        """Blocking: the events that arrive within timeout_ms (runs in a worker thread)."""
        deadline = time.monotonic() + timeout_ms / 1000
        with self._lock, _translated("waiting for events"):
            if self._closing:
                return []
            if self._stale_events or self._event_set is None:
                self._free_event_set()
                self._create_event_set()
            while not self._closing:
                remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
                first = self._wait_one(min(remaining_ms, _WAIT_SLICE_MS))
                if first is not None:
                    return [first, *self._drain()]
                if remaining_ms <= _WAIT_SLICE_MS or self._stale_events:
                    break  # timed out, or a GPU was lost: the caller re-reads status
        return []

    def _wait_one(self, timeout_ms: int) -> Any:
        try:
            return pynvml.nvmlEventSetWait_v2(self._event_set, timeout_ms)
        except pynvml.NVMLError as exc:
            if _code(exc) == pynvml.NVML_ERROR_TIMEOUT:
                return None
            if _code(exc) == pynvml.NVML_ERROR_GPU_IS_LOST:
                self._stale_events = True  # status() reports the loss
                return None
            raise

    def _drain(self) -> list[Any]:
        out: list[Any] = []
        while len(out) < _DRAIN_MAX and (data := self._wait_one(0)) is not None:
            out.append(data)
        return out

    def _create_event_set(self) -> None:
        self._event_set = pynvml.nvmlEventSetCreate()
        self._stale_events = False
        for index in range(int(pynvml.nvmlDeviceGetCount())):
            try:
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(pynvml.nvmlDeviceGetUUID(handle))
                mask = _WANTED_EVENTS & int(pynvml.nvmlDeviceGetSupportedEventTypes(handle))
                pynvml.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
            except pynvml.NVMLError as exc:
                # a lost GPU is registered again once status() sees it reset
                if _code(exc) not in (_NOT_SUPPORTED, pynvml.NVML_ERROR_GPU_IS_LOST):
                    raise
                if index not in self._unregistered:
                    self._unregistered.add(index)
                    log.warning("nvml_events_unavailable", index=index, error=str(exc))
                continue
            self._event_uuids[_handle_key(handle)] = uuid
            self._known.add(uuid)

    def _free_event_set(self) -> None:
        if self._event_set is None:
            return
        event_set, self._event_set = self._event_set, None
        self._event_uuids.clear()
        try:
            pynvml.nvmlEventSetFree(event_set)
        except pynvml.NVMLError as exc:
            log.warning("nvml_event_set_free_failed", error=str(exc))


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    try:
        yield
    except pynvml.NVMLError as exc:
        raise BackendError(f"NVML {what}: {exc}") from exc


def _gpu_info(index: int, handle: object) -> GpuInfo:
    memory_bytes = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    mig_enabled = _mig_enabled(handle)
    return GpuInfo(
        index=index,
        uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
        pci_bus_id=_bus_id(pynvml.nvmlDeviceGetPciInfo(handle)),
        name=_text(pynvml.nvmlDeviceGetName(handle)),
        memory_mib=memory_bytes // 2**20,
        minor=int(pynvml.nvmlDeviceGetMinorNumber(handle)),
        mig_enabled=mig_enabled,
        mig_instances=_mig_instances(handle, memory_bytes) if mig_enabled else (),
        nvlink_peers=_nvlink_peers(handle),
    )


def _mig_enabled(handle: object) -> bool:
    try:
        current = pynvml.nvmlDeviceGetMigMode(handle)[0]
    except pynvml.NVMLError as exc:
        if _code(exc) == pynvml.NVML_ERROR_NOT_SUPPORTED:
            return False
        raise
    return bool(current == pynvml.NVML_DEVICE_MIG_ENABLE)


def _mig_instances(handle: object, memory_bytes: int) -> tuple[MigInstance, ...]:
    out: list[MigInstance] = []
    for slot in range(int(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError as exc:
            if _code(exc) == pynvml.NVML_ERROR_NOT_FOUND:
                continue  # an empty slot
            raise
        attrs = pynvml.nvmlDeviceGetAttributes(mig)
        profile = mig_profile_name(
            int(attrs.gpuInstanceSliceCount),
            int(attrs.computeInstanceSliceCount),
            int(attrs.memorySizeMB),
            memory_bytes,
        )
        out.append(
            MigInstance(
                uuid=_text(pynvml.nvmlDeviceGetUUID(mig)),
                profile=profile,
                gpu_instance=int(pynvml.nvmlDeviceGetGpuInstanceId(mig)),
                compute_instance=int(pynvml.nvmlDeviceGetComputeInstanceId(mig)),
            )
        )
    return tuple(out)


def _nvlink_peers(handle: object) -> tuple[str, ...]:
    peers: list[str] = []
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            if pynvml.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                continue
            peers.append(_bus_id(pynvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)))
        except pynvml.NVMLError as exc:
            # no NVLink at all, or fewer links than the maximum
            if _code(exc) not in (
                pynvml.NVML_ERROR_NOT_SUPPORTED,
                pynvml.NVML_ERROR_INVALID_ARGUMENT,
            ):
                raise
    return tuple(peers)
