"""Degraded-device probes off the event loop (docs/degraded.md): every device's blocking
reading in turn, in one worker thread of their own, never more than one round at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

import structlog

from agents.errors import BackendError
from agents.hw.nvml_calls import Worker

R = TypeVar("R")
log = structlog.get_logger(__name__)


class SignalProbes(Generic[R]):
    """Calls `read(key)` (blocking: NVML's `probe`, `Sysfs.nic_reading`) for each key in
    a worker thread. A round that outlives its wait is left to finish; until it does,
    later rounds answer nothing rather than queue behind it (a hung GPU is the status
    probe's business, and must not grow a backlog here)."""

    def __init__(self, read: Callable[[str], R], name: str) -> None:
        self._read = read
        self._name = name
        self._worker: Worker | None = None
        self._round: asyncio.Future[dict[str, R]] | None = None

    async def readings(self, keys: Iterable[str], wait_s: float) -> dict[str, R]:
        """Each key's reading, from a round that ends within wait_s (this one, or one
        that an earlier call left running); a key whose read failed is left out."""
        if self._round is None or self._round.done():
            chosen = list(keys)
            if self._worker is None:
                self._worker = Worker(self._name)
            self._round = self._worker.submit(lambda: self._all(chosen))
        current = self._round
        await asyncio.wait({current}, timeout=wait_s)  # a timer, not a task
        if not current.done():
            return {}
        self._round = None
        return current.result()

    def _all(self, keys: list[str]) -> dict[str, R]:
        """Blocking, in the worker thread."""
        out: dict[str, R] = {}
        for key in keys:
            try:
                out[key] = self._read(key)
            except BackendError as exc:  # lost, unknown or failing: the status probe says so
                log.debug("signal_probe_failed", probe=self._name, device=key, error=str(exc))
        return out

    def close(self) -> None:
        """Let the worker thread go (a busy one once its round returns)."""
        if self._worker is not None:
            self._worker.close()
            self._worker = None
