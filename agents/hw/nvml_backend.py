"""The real Nvml: the driver's libnvidia-ml through pynvml, errors become BackendError."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pynvml
import structlog

from agents.errors import BackendError
from agents.hw.nvml import GpuInfo, GpuStatus, XidEvent
from agents.hw.nvml_calls import in_thread
from agents.hw.nvml_query import ODD_ANSWERS, GpuReader, code, handle_key, text

log = structlog.get_logger(__name__)

_WANTED_EVENTS = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)
_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
_WAIT_SLICE_MS = 250  # bounds how long shutdown() waits for an in-flight wait
_SHUTDOWN_WAIT_S = 1.0  # how long shutdown() waits for a hung event wait to let go
_DRAIN_MAX = 64
XID_DOUBLE_BIT_ECC = 48  # what NVML reports for an uncorrectable ECC error


class NvmlBackend:
    """Nvml over the driver's libnvidia-ml, through pynvml (or `lib`, a stand-in with its
    interface). pynvml errors become BackendError, or a GpuStatus that says what failed.

    init() and shutdown() pair up as NVML's own do (NVML counts them). XID events arrive
    through an NVML event set waited on in a daemon thread; the wait is sliced so that
    the last shutdown() rarely waits for it, and never long when it hangs.
    """

    def __init__(self, lib: Any = pynvml) -> None:
        self._lib = lib
        self._reader = GpuReader(lib)
        self._inits = 0
        self._closing = False
        self._known: set[str] = set()  # UUIDs listed once: NOT_FOUND later means lost
        self._lost: set[str] = set()  # seen lost: answering again means it was reset
        self._ecc: dict[str, int] = {}  # volatile uncorrectable ECC count at the last probe
        self._lock = threading.Lock()  # the event set: one waiter, or its release
        self._event_set: Any = None
        self._event_uuids: dict[int, str] = {}
        self._stale_events = False
        self._unregistered: set[int] = set()  # GPU indices without events, logged once

    def init(self) -> None:
        try:
            self._lib.nvmlInit()
        except ODD_ANSWERS as exc:
            raise BackendError(f"NVML unavailable: {exc}") from exc
        self._inits += 1
        self._closing = False

    def shutdown(self) -> None:
        if self._inits == 0:
            return
        self._inits -= 1
        if self._inits == 0:
            self._closing = True
            if not self._lock.acquire(timeout=_SHUTDOWN_WAIT_S):
                # An event wait hangs in the driver: NVML cannot be shut down under it.
                log.warning("nvml_shutdown_skipped", reason="an event wait does not return")
                return
            try:
                self._free_event_set()
            finally:
                self._lock.release()
        try:
            self._lib.nvmlShutdown()
        except ODD_ANSWERS as exc:
            raise BackendError(f"NVML shutdown failed: {exc}") from exc

    def driver_version(self) -> str:
        with _translated("reading the driver version"):
            return text(self._lib.nvmlSystemGetDriverVersion())

    def gpus(self) -> Sequence[GpuInfo]:
        """Every GPU NVML lists; one whose UUID NVML will not give is left out."""
        with _translated("counting GPUs"):
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
            self._stale_events = True  # a reset GPU needs its events registered again
        return GpuStatus(lost=False, xids=self._ecc_xids(uuid, handle))

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

    async def next_events(self, timeout_s: float) -> list[XidEvent]:
        if self._inits == 0:
            raise BackendError("NVML events: not initialised")
        raw = await in_thread(lambda: self._wait(max(0, int(timeout_s * 1000))), "nvml-events")
        events: list[XidEvent] = []
        for data in raw:
            if not data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                log.debug("nvml_ecc_event", event_type=int(data.eventType))
                continue
            uuid = self._event_uuid(data.device)
            if uuid is not None:
                events.append(XidEvent(uuid=uuid, xid=int(data.eventData)))
        return events

    def _event_uuid(self, handle: Any) -> str | None:
        uuid = self._event_uuids.get(handle_key(handle))
        if uuid is None:
            with contextlib.suppress(*ODD_ANSWERS):
                uuid = text(self._lib.nvmlDeviceGetUUID(handle))
        return uuid

    def _wait(self, timeout_ms: int) -> list[Any]:
        """Blocking: the events that arrive within timeout_ms (runs in a daemon thread)."""
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
                if remaining_ms <= _WAIT_SLICE_MS:
                    break  # timed out
        return []

    def _wait_one(self, timeout_ms: int) -> Any:
        try:
            return self._lib.nvmlEventSetWait_v2(self._event_set, timeout_ms)
        except pynvml.NVMLError as exc:
            if code(exc) == pynvml.NVML_ERROR_TIMEOUT:
                return None
            if code(exc) == _LOST:
                # status() reports the loss; the next wait registers the GPUs again.
                # NVML may answer so at once for every wait: sit the slice out instead.
                self._stale_events = True
                time.sleep(timeout_ms / 1000)
                return None
            raise

    def _drain(self) -> list[Any]:
        out: list[Any] = []
        while len(out) < _DRAIN_MAX and (data := self._wait_one(0)) is not None:
            out.append(data)
        return out

    def _create_event_set(self) -> None:
        lib = self._lib
        self._event_set = lib.nvmlEventSetCreate()
        self._stale_events = False
        for index in range(int(lib.nvmlDeviceGetCount())):
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(index)
                uuid = text(lib.nvmlDeviceGetUUID(handle))
                mask = _WANTED_EVENTS & int(lib.nvmlDeviceGetSupportedEventTypes(handle))
                lib.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
            except ODD_ANSWERS as exc:
                # a lost GPU is registered again once status() sees it answer
                if index not in self._unregistered:
                    self._unregistered.add(index)
                    log.warning("nvml_events_unavailable", index=index, error=str(exc))
                continue
            self._unregistered.discard(index)
            self._event_uuids[handle_key(handle)] = uuid
            self._known.add(uuid)

    def _free_event_set(self) -> None:
        if self._event_set is None:
            return
        event_set, self._event_set = self._event_set, None
        self._event_uuids.clear()
        try:
            self._lib.nvmlEventSetFree(event_set)
        except ODD_ANSWERS as exc:
            log.warning("nvml_event_set_free_failed", error=str(exc))


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    try:
        yield
    except ODD_ANSWERS as exc:
        raise BackendError(f"NVML {what}: {exc}") from exc
