"""NVML calls off the event loop: each blocking call runs in a daemon thread, so a call
that hangs in the driver delays no coroutine and never holds up the process's exit."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import TypeVar

import structlog

from agents.errors import BackendError
from agents.hw.nvml import GpuStatus, Nvml

T = TypeVar("T")
log = structlog.get_logger(__name__)

HANG_S = 10.0  # a GPU whose NVML call has not returned for this long is Unhealthy (hung)


def in_thread(call: Callable[[], T], name: str = "nvml") -> asyncio.Future[T]:
    """Run `call` in a new daemon thread; its result or exception lands in the future.

    Not asyncio.to_thread: the default executor's threads are joined at exit, so one
    call hung in the driver would keep the process from ever exiting."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if future.done():
            return  # cancelled meanwhile: the caller stopped waiting
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result, error = call(), None
        except Exception as exc:  # handed to the awaiting coroutine, not lost
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=work, name=name, daemon=True).start()
    return future


async def bounded(call: Callable[[], T], timeout_s: float, name: str = "nvml") -> T:
    """`call` off the loop; BackendError when it has not returned within timeout_s
    (the thread is left to finish or hang on its own)."""
    future = in_thread(call, name)
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout_s)
    except TimeoutError as exc:
        raise BackendError(f"NVML {name}: no answer within {timeout_s:g} s") from exc


class StatusProbe:
    """Asks NVML about every GPU, each in its own thread, at most one question per GPU
    at a time. A GPU whose question is unanswered after `hang_s` reads as hung."""

    def __init__(
        self, nvml: Nvml, hang_s: float = HANG_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._nvml = nvml
        self._hang_s = hang_s
        self._clock = clock
        self._asked: dict[str, tuple[float, asyncio.Future[GpuStatus]]] = {}
        self._slow: set[str] = set()  # GPUs whose question outlived one wait: logged once

    async def statuses(self, uuids: Iterable[str], wait_s: float) -> dict[str, GpuStatus]:
        """The answers that arrive within wait_s, and `hung` for GPUs past the bound;
        GPUs still being asked, within the bound, are left out (nothing new)."""
        for uuid in uuids:
            if uuid not in self._asked:
                call = _status_call(self._nvml, uuid)
                self._asked[uuid] = (self._clock(), in_thread(call, f"nvml-status-{uuid}"))
        pending = [f for _, f in self._asked.values() if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=wait_s)
        out: dict[str, GpuStatus] = {}
        now = self._clock()
        for uuid, (since, future) in list(self._asked.items()):
            if future.done():
                del self._asked[uuid]
                self._slow.discard(uuid)
                out[uuid] = future.result()
                continue
            if uuid not in self._slow:
                self._slow.add(uuid)
                log.warning("nvml_call_slow", gpu=uuid, waited_s=round(now - since, 2))
            if now - since >= self._hang_s:
                out[uuid] = GpuStatus(lost=False, hung=True)
        return out


def _status_call(nvml: Nvml, uuid: str) -> Callable[[], GpuStatus]:
    def call() -> GpuStatus:
        try:
            return nvml.status(uuid)
        except BackendError as exc:  # e.g. not initialised: the GPU stays listed
            return GpuStatus(lost=False, error=str(exc))

    return call
