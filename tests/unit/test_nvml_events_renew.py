"""The event set is renewed (a GPU reset, NVML answering GPU_IS_LOST to a wait) without
losing an event: the fresh set is registered before the old one is freed, and what the
old one still holds is taken first. NVML delivers an event to every set registered for
its GPU when it occurs, as the fake library here does."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Callable
from typing import Any

import pynvml

from agents.hw.nvml_events import NvmlEvents

WITHIN_S = 5.0

GPUS = 2


class _Data(ctypes.Structure):
    _fields_ = [
        ("device", ctypes.c_void_p),
        ("eventType", ctypes.c_ulonglong),
        ("eventData", ctypes.c_ulonglong),
    ]


class EventLib:
    """NVML's event calls over GPUS GPUs; `created` runs as each set is created."""

    def __init__(self) -> None:
        self.handles = [ctypes.c_void_p(0x1000 + i) for i in range(GPUS)]
        self.sets: dict[int, list[_Data]] = {}  # live sets: their queues
        self.registered: dict[int, set[int]] = {}  # set -> GPU indices
        self.created: Callable[[int], None] = lambda key: None
        self.joined: Callable[[int, int], None] = lambda key, gpu: None  # a GPU registered
        self._next = 1

    def emit(self, gpu: int, xid: int) -> None:
        for key, queue in self.sets.items():
            if gpu in self.registered[key]:
                queue.append(_Data(self.handles[gpu].value, 8, xid))

    def nvmlEventSetCreate(self) -> int:
        key, self._next = self._next, self._next + 1
        self.sets[key], self.registered[key] = [], set()
        self.created(key)
        return key

    def nvmlEventSetFree(self, key: int) -> None:
        del self.sets[key], self.registered[key]

    def nvmlDeviceGetCount(self) -> int:
        return GPUS

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ctypes.c_void_p:
        return self.handles[index]

    def nvmlDeviceGetUUID(self, handle: ctypes.c_void_p) -> str:
        return f"GPU-{self._index(handle)}"

    def nvmlDeviceGetSupportedEventTypes(self, handle: ctypes.c_void_p) -> int:
        return int(pynvml.nvmlEventTypeXidCriticalError)

    def nvmlDeviceRegisterEvents(self, handle: ctypes.c_void_p, mask: int, key: int) -> None:
        self.registered[key].add(self._index(handle))
        self.joined(key, self._index(handle))

    def nvmlDeviceGetMemoryInfo(self, handle: ctypes.c_void_p) -> object:
        return object()

    def nvmlEventSetWait_v2(self, key: int, timeout_ms: int) -> Any:
        if not self.sets[key]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return self.sets[key].pop(0)

    def _index(self, handle: Any) -> int:
        value = handle.value if isinstance(handle, ctypes.c_void_p) else handle
        return [h.value for h in self.handles].index(value)


async def _next_events(events: NvmlEvents) -> list[tuple[str | None, int]]:
    began = time.monotonic()
    seen: list[tuple[str | None, Any]] = []
    while not seen:
        assert time.monotonic() - began < WITHIN_S, "no event came"
        seen = await events.wait(0.2)
    return [(uuid, int(data.eventData)) for uuid, data in seen]


async def test_an_event_that_arrives_while_the_set_is_renewed_is_not_lost() -> None:
    lib = EventLib()
    events = NvmlEvents(lib, set())
    try:
        assert await events.wait(0.05) == []  # the thread runs, its first set made
        # The XID occurs as the fresh set is created, before any GPU is registered with
        # it: only the old set has it, and freeing that set first would lose it.
        lib.created = lambda key: lib.emit(1, 79)
        events.stale = True
        assert await _next_events(events) == [("GPU-1", 79)]
        assert len(lib.sets) == 1  # the old set was freed
    finally:
        events.close(2.0)


async def test_an_event_that_reaches_both_sets_is_told_once() -> None:
    lib = EventLib()
    events = NvmlEvents(lib, set())
    try:
        assert await events.wait(0.05) == []
        # Once the fresh set has GPU 1 too, the XID is in both sets.
        lib.joined = lambda key, gpu: lib.emit(1, 79) if gpu == 1 else None
        events.stale = True
        assert await _next_events(events) == [("GPU-1", 79)]
        lib.joined = lambda key, gpu: None
        lib.emit(0, 48)
        assert await _next_events(events) == [("GPU-0", 48)]  # nothing of 79 left over
    finally:
        events.close(2.0)
