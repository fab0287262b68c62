"""Waiting on conditions with a deadline: the only way tests synchronise."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

DEFAULT_TIMEOUT = 10.0
# How long a test waits for what should take milliseconds, on a loaded 2-core machine:
WAIT = 10.0  # a change inside this process (the agent, the stand-ins)
PROCESS_WAIT = 30.0  # a process started, registered or answering


def wait_until(
    condition: Callable[[], object], within: float = DEFAULT_TIMEOUT, what: str = ""
) -> None:
    """Block until condition() is truthy; fail the test after `within` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or condition}")
        time.sleep(0.01)


async def async_wait_until(
    condition: Callable[[], object], within: float = DEFAULT_TIMEOUT, what: str = ""
) -> None:
    """Yield to the loop until condition() is truthy; fail after `within` seconds."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what or condition}")
        await asyncio.sleep(0.01)
