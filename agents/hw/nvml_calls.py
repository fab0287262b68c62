"""NVML calls off the event loop: each blocking call runs in a daemon thread, so a call
that hangs in the driver delays no coroutine and never holds up the process's exit."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import structlog

from agents.errors import BackendError
from agents.hw.nvml import GpuStatus, Nvml
from agents.tasks import off_loop, settle

T = TypeVar("T")
log = structlog.get_logger(__name__)

HANG_S = 10.0  # a GPU whose NVML call has not returned for this long is Unhealthy (hung)


class Worker:
    """One daemon thread that runs calls in turn: a GPU's own, so that a call hung on one
    GPU holds up no other GPU, and a probe tick starts no thread."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[tuple[asyncio.Future[Any], Callable[[], Any]] | None]
        self._calls = queue.SimpleQueue()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def submit(self, call: Callable[[], T]) -> asyncio.Future[T]:
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._calls.put((future, call))
        return future

    def close(self) -> None:
        """The thread ends after the call in hand (at once when idle)."""
        self._calls.put(None)

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            settle(*item)


def waited(call: Callable[[], T], timeout_s: float, name: str = "nvml") -> T:
    """Blocking: `call` in a daemon thread, waited for at most timeout_s (BackendError
    then; the thread is left to finish or hang on its own). For calls made before
    anything is served, where a hang must still end in a clear error."""
    box: list[tuple[T | None, BaseException | None]] = []
    done = threading.Event()

    def work() -> None:
        try:
            box.append((call(), None))
        except BaseException as exc:  # re-raised in the waiting thread
            box.append((None, exc))
        done.set()

    threading.Thread(target=work, name=name, daemon=True).start()
    if not done.wait(timeout_s):
        raise BackendError(f"NVML {name}: no answer within {timeout_s:g} s")
    result, error = box[0]
    if error is not None:
        raise error
    return result  # type: ignore[return-value]


async def bounded(call: Callable[[], T], timeout_s: float, name: str = "nvml") -> T:
    """`call` off the loop; BackendError when it has not returned within timeout_s
    (the thread is left to finish or hang on its own)."""
    future = off_loop(call, name)
    try:
        return await asyncio.wait_for(asyncio.shield(future), timeout_s)
    except TimeoutError as exc:
        raise BackendError(f"NVML {name}: no answer within {timeout_s:g} s") from exc


@dataclass
class _Batch:
    """One tick's questions, asked in turn by one worker thread."""

    uuids: list[str]
    answers: dict[str, GpuStatus] = field(default_factory=dict)
    asking: tuple[str, float] | None = None  # the GPU being asked now, since when
    abandoned: bool = False  # the caller moved on: ask nothing more


class StatusProbe:
    """Asks NVML about every GPU: all of them in turn in one worker thread (a tick costs
    one thread hand-off), at most one question per GPU at a time. When a question does not
    return within the tick's wait, that worker is left to it and a fresh one asks the
    others from the next tick on; a GPU whose question is unanswered after `hang_s` reads
    as hung."""

    def __init__(
        self, nvml: Nvml, hang_s: float = HANG_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._nvml = nvml
        self._hang_s = hang_s
        self._clock = clock
        self._worker: Worker | None = None
        self._stuck: list[_Batch] = []  # batches whose worker hangs on a question
        self._slow: set[str] = set()  # GPUs whose question outlived one wait: logged once

    async def statuses(self, uuids: Iterable[str], wait_s: float) -> dict[str, GpuStatus]:
        """The answers that arrive within wait_s, and `hung` for GPUs past the bound;
        GPUs still being asked, within the bound, are left out (nothing new)."""
        out = self._late_answers()
        busy = {b.asking[0] for b in self._stuck if b.asking is not None}
        batch = _Batch([u for u in uuids if u not in busy])
        if self._worker is None:
            self._worker = Worker("nvml-status")
        done = self._worker.submit(lambda: self._ask(batch))
        await asyncio.wait({done}, timeout=wait_s)  # a timer, not a task
        if not done.done():
            batch.abandoned = True
            self._stuck.append(batch)
            self._worker.close()  # it ends once its call returns
            self._worker = None
        out.update(batch.answers)
        batch.answers = {}
        self._slow.difference_update(out)
        now = self._clock()
        for stuck in self._stuck:
            if stuck.asking is None:
                continue
            uuid, since = stuck.asking
            if uuid not in self._slow:
                self._slow.add(uuid)
                log.warning("nvml_call_slow", gpu=uuid, waited_s=round(now - since, 2))
            if now - since >= self._hang_s:
                out[uuid] = GpuStatus(lost=False, hung=True)
        return out

    def _late_answers(self) -> dict[str, GpuStatus]:
        """Answers that hung questions gave since the last tick."""
        out: dict[str, GpuStatus] = {}
        for stuck in self._stuck:
            answers, stuck.answers = stuck.answers, {}
            out.update(answers)
        self._stuck = [b for b in self._stuck if b.asking is not None]
        return out

    def _ask(self, batch: _Batch) -> None:
        """Blocking, in the worker thread: each GPU of the batch in turn."""
        for uuid in batch.uuids:
            if batch.abandoned:
                break
            batch.asking = (uuid, self._clock())
            batch.answers[uuid] = _status_call(self._nvml, uuid)()
            batch.asking = None

    def close(self) -> None:
        """Let the worker thread go (a hung one when its call returns)."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None


def _status_call(nvml: Nvml, uuid: str) -> Callable[[], GpuStatus]:
    def call() -> GpuStatus:
        try:
            return nvml.status(uuid)
        except BackendError as exc:  # e.g. not initialised: the GPU stays listed
            return GpuStatus(lost=False, error=str(exc))

    return call
