"""NVML's event set for every GPU, read by one long-lived daemon thread that hands what
arrives to the event loop: an idle agent looks for XIDs without starting threads.

The thread looks every 200 ms: it touches each GPU, then takes the events that are
there, without waiting in NVML. A wait inside NVML costs nothing on a real driver, but a
library with a runtime of its own (NVIDIA's mock NVML, in Go) waits by polling in its own
threads, which then cost more CPU than the touches; and that mock trips an injected
fault only at a call about the GPU. So an event is seen within one pause on both, and a
GPU that falls off the bus without an event wakes the waiter just as soon."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import deque
from typing import Any

import pynvml
import structlog

from agents.errors import BackendError
from agents.hw.nvml_query import ODD_ANSWERS, code, handle_key, text, translated

log = structlog.get_logger(__name__)

WANTED_EVENTS = (
    pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeSingleBitEccError
)
_PAUSE_S = 0.2  # between two looks: bounds how late an event or a silent loss is seen
_HUNG_S = 0.4  # one NVML call of the thread this long: the waiter waits for it
_RETRY_S = 1.0  # after a failed wait, before the next one
_DRAIN_MAX = 64
_PENDING_MAX = 1024  # events nobody has asked for yet: the oldest go first
_LOST = pynvml.NVML_ERROR_GPU_IS_LOST


class NvmlEvents:
    """The event set and its thread, started by the first wait(), ended by close().

    The thread looks in slices, holding `_lock` for one slice at a time, so that close()
    can free the set between two slices; a slice that hangs in the driver holds up no
    coroutine, only close(), and that for a bounded time.

    A slice is nvmlDeviceGetMemoryInfo on each GPU registered (the status probe's call):
    a GPU that answers GPU_IS_LOST wakes the waiter, once, with or without an event; then
    the events NVML holds, taken with a zero timeout. The event loop is woken only with
    news. The touch is made by this thread, not one of its own: over the mock's Go
    runtime, calls from a second thread cost several times more CPU. So a touch hung in
    the driver holds up the events of the other GPUs until it returns, as a hung wait
    does; the status probe, on threads it can abandon, still judges every GPU."""

    def __init__(self, lib: Any, known: set[str]) -> None:
        self._lib = lib
        self._known = known  # UUIDs listed by the backend: registering lists them too
        self._lock = threading.Lock()  # the event set: one slice of waiting, or its release
        self._event_set: Any = None
        self._uuids: dict[int, str] = {}
        self.stale = False  # a GPU was reset: register every GPU again before the next slice
        self._unregistered: set[int] = set()  # GPU indices without events, logged once
        self._mutex = threading.Lock()  # what the thread hands over, and who waits for it
        self._pending: deque[tuple[str | None, Any]] = deque(maxlen=_PENDING_MAX)
        self._error: BackendError | None = None
        self._lost_news = False  # a touch found a GPU lost: the waiter is to look now
        self._touchable: tuple[tuple[int, Any], ...] = ()  # (index, handle) registered
        self._told_lost: set[int] = set()  # GPU indices a touch found lost, told once
        # When the last round of touches ended with every GPU answering normally.
        self.answered_at: float | None = None
        self._waiter: asyncio.Future[None] | None = None  # woken by the thread with news
        self._stop: threading.Event | None = None  # the running thread's; None: none runs
        self._calling_since: float | None = None  # when the thread's NVML call began

    async def wait(self, timeout_s: float) -> list[tuple[str | None, Any]]:
        """The events that arrive within timeout_s, each with its GPU's UUID (None where
        NVML will not say); longer only while the wait in hand hangs in the driver.
        Raises BackendError when the last slice failed."""
        if self._stop is None:
            self._stop = threading.Event()
            threading.Thread(
                target=self._run, args=(self._stop,), name="nvml-events", daemon=True
            ).start()
        waiter = asyncio.get_running_loop().create_future()
        with self._mutex:
            news = bool(self._pending) or self._error is not None or self._lost_news
            self._lost_news = False
            if not news:
                self._waiter = waiter
        if not news:
            try:
                # The thread wakes the waiter with news; the loop's timer ends the wait
                # without any (the thread keeps no clock of the waiter's).
                await asyncio.wait({waiter}, timeout=timeout_s)
                if not waiter.done() and self._hung():
                    await waiter  # until the call returns, as long as NVML hangs
            finally:
                with self._mutex:
                    if self._waiter is waiter:
                        self._waiter = None
        with self._mutex:
            raw = list(self._pending)
            self._pending.clear()
            error = None
            if not raw:  # an error after these events is told at the next wait
                error, self._error = self._error, None
        if error is not None:
            raise error
        return raw

    def _hung(self) -> bool:
        """The thread is in one NVML call for far longer than any call should take."""
        since = self._calling_since
        return since is not None and time.monotonic() - since > _HUNG_S

    def _uuid(self, handle: Any) -> str | None:
        uuid = self._uuids.get(handle_key(handle))
        if uuid is None:
            with contextlib.suppress(*ODD_ANSWERS):
                uuid = text(self._lib.nvmlDeviceGetUUID(handle))
        return uuid

    def close(self, within_s: float) -> bool:
        """End the thread and free the set; False (set kept) when a wait does not
        return within within_s: NVML must not be shut down under it."""
        stop, self._stop = self._stop, None
        if stop is not None:
            stop.set()
        if not self._lock.acquire(timeout=within_s):
            return False
        try:
            self._free()
        finally:
            self._lock.release()
        return True

    def _run(self, stop: threading.Event) -> None:
        """The thread: slice after slice until close(); each outcome to the waiter."""
        while not stop.is_set():
            try:
                raw, lost = self._slice(stop)
            except Exception as exc:  # told to the waiter; the thread must go on
                error = (
                    exc if isinstance(exc, BackendError) else BackendError(f"NVML events: {exc!r}")
                )
                self._hand([], error)
                stop.wait(_RETRY_S)
                continue
            if raw or lost:
                self._hand(raw, None, lost=lost)
            else:
                # A plain sleep: close() never waits for it (it takes `_lock`, which no
                # pause holds), and it costs less than waiting on `stop`.
                time.sleep(_PAUSE_S)
        self._hand([], None)  # closed: nobody waits on a thread that has ended

    def _slice(self, stop: threading.Event) -> tuple[list[tuple[str | None, Any]], bool]:
        """The events that are there now, after a touch of every GPU; whether a touch
        found a GPU lost."""
        with self._lock, translated("waiting for events"):
            if stop.is_set():
                return [], False
            held: list[Any] = []
            lost = False
            if self.stale or self._event_set is None:
                held, lost = self._renew()
            lost = self._touch() or lost
            raw = self._drain(self._event_set)
            if held:
                raw = _once([*held, *raw])
            return [(self._uuid(data.device), data) for data in raw], lost

    def _hand(
        self,
        raw: list[tuple[str | None, Any]],
        error: BackendError | None,
        lost: bool = False,
    ) -> None:
        """Keep what the slice brought; wake the waiter, if any, with it."""
        with self._mutex:
            self._pending.extend(raw)
            if error is not None:
                self._error = error
            waiter, self._waiter = self._waiter, None  # woken once
            if lost and waiter is None:
                self._lost_news = True  # for the next wait
        if waiter is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
                waiter.get_loop().call_soon_threadsafe(_wake, waiter)

    def _take_one(self, event_set: Any) -> Any:
        """The next event the set holds, without waiting; None when there is none."""
        self._calling_since = time.monotonic()
        try:
            return self._lib.nvmlEventSetWait_v2(event_set, 0)
        except pynvml.NVMLError as exc:
            if code(exc) == pynvml.NVML_ERROR_TIMEOUT:
                return None
            if code(exc) == pynvml.NVML_ERROR_GPU_IS_LOST:
                # status() reports the loss; the next slice registers the GPUs again,
                # after the pause (NVML may answer so to every wait while it lasts).
                self.stale = True
                return None
            raise
        finally:
            self._calling_since = None

    def _touch(self) -> bool:
        """Whether a GPU registered answers GPU_IS_LOST now where it did not before: a
        loss is told once, and again only after the GPU has answered in between."""
        news = False
        normal = bool(self._touchable) and not self._unregistered
        for index, handle in self._touchable:
            self._calling_since = time.monotonic()
            try:
                self._lib.nvmlDeviceGetMemoryInfo(handle)
            except pynvml.NVMLError as exc:
                # The set is kept: the other GPUs' events go on arriving in it, and the
                # GPU is registered again once status() sees it answer (a reset).
                if code(exc) == _LOST and index not in self._told_lost:
                    self._told_lost.add(index)
                    news = True
                normal = False
                continue
            except ODD_ANSWERS:
                normal = False
                continue  # an odd answer is the status probe's to judge
            finally:
                self._calling_since = None
            self._told_lost.discard(index)
        self.answered_at = time.monotonic() if normal else None
        return news

    def _drain(self, event_set: Any) -> list[Any]:
        out: list[Any] = []
        while len(out) < _DRAIN_MAX and (data := self._take_one(event_set)) is not None:
            out.append(data)
        return out

    def _renew(self) -> tuple[list[Any], bool]:
        """A fresh set with every GPU that answers, registered before the old set is
        freed, so that an event arriving meanwhile is in one of them or both, never in
        neither: the events the old set still held, and whether a GPU was found newly
        lost."""
        old, self._event_set = self._event_set, None
        lost = self._create()
        if old is None:
            return [], lost
        held = self._drain(old)
        self._free_set(old)
        return held, lost

    def _create(self) -> bool:
        """A fresh set with every GPU that answers; whether one was found newly lost."""
        lib = self._lib
        news = False
        self._event_set = lib.nvmlEventSetCreate()
        self.stale = False
        touchable: list[tuple[int, Any]] = []
        for index in range(int(lib.nvmlDeviceGetCount())):
            try:
                handle = lib.nvmlDeviceGetHandleByIndex(index)
                uuid = text(lib.nvmlDeviceGetUUID(handle))
                mask = WANTED_EVENTS & int(lib.nvmlDeviceGetSupportedEventTypes(handle))
                lib.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
            except ODD_ANSWERS as exc:
                # a lost GPU is registered again once status() sees it answer
                lost = isinstance(exc, pynvml.NVMLError) and code(exc) == _LOST
                if lost and index not in self._told_lost:
                    self._told_lost.add(index)
                    news = True
                if index not in self._unregistered:
                    self._unregistered.add(index)
                    log.warning("nvml_events_unavailable", index=index, error=str(exc))
                continue
            self._unregistered.discard(index)
            self._uuids[handle_key(handle)] = uuid
            self._known.add(uuid)
            touchable.append((index, handle))
        self._touchable = tuple(touchable)
        return news

    def _free(self) -> None:
        if self._event_set is None:
            return
        event_set, self._event_set = self._event_set, None
        self._uuids.clear()
        self._touchable = ()
        self._free_set(event_set)

    def _free_set(self, event_set: Any) -> None:
        try:
            self._lib.nvmlEventSetFree(event_set)
        except ODD_ANSWERS as exc:
            log.warning("nvml_event_set_free_failed", error=str(exc))


def _once(events: list[Any]) -> list[Any]:
    """Each event once: one that reached both the old and the new set while the sets were
    renewed is the same GPU, type and data twice in a row of one slice."""
    seen: set[tuple[int, int, int]] = set()
    out = []
    for data in events:
        key = (handle_key(data.device), int(data.eventType), int(data.eventData))
        if key not in seen:
            seen.add(key)
            out.append(data)
    return out


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():  # cancelled meanwhile: the caller stopped waiting
        waiter.set_result(None)
