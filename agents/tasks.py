"""How the agent waits and stops: tasks live in a TaskGroup and stop by cancellation.
`first` is the one way to wait for whichever of several things happens first."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
Job = Callable[[], Coroutine[Any, Any, None]]


def off_loop(call: Callable[[], T], name: str) -> asyncio.Future[T]:
    """Run blocking `call` in a new daemon thread; await the future for its outcome.

    Not asyncio.to_thread: the default executor's threads are joined at exit, so a call
    hung in a driver would keep the process from ever exiting. Cancelling the future
    leaves the thread to finish, or hang, on its own. For rare calls (discovery): a
    steady stream of calls belongs to a thread of its own."""
    future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
    threading.Thread(target=settle, args=(future, call), name=name, daemon=True).start()
    return future


def settle(future: asyncio.Future[T], call: Callable[[], T]) -> None:
    """Run `call` here (a worker thread) and hand its outcome to `future`'s loop."""
    try:
        result, error = call(), None
    except BaseException as exc:  # handed to the awaiting coroutine, not lost
        result, error = None, exc

    def outcome() -> None:
        if future.done():
            return  # cancelled meanwhile: the caller stopped waiting
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    with contextlib.suppress(RuntimeError):  # the loop closed: nobody is waiting
        future.get_loop().call_soon_threadsafe(outcome)


async def first(*waits: Awaitable[object], within: float | None = None) -> None:
    """Return when the first of `waits` completes (or after `within` seconds); the rest
    are cancelled and awaited, so nothing is left running. A failure of the first one to
    complete is raised."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    if not tasks:  # nothing can happen: only `within`, or cancellation, ends this
        await (asyncio.sleep(within) if within is not None else asyncio.Event().wait())
        return
    try:
        done, _ = await asyncio.wait(tasks, timeout=within, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await _cancelled(tasks)
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            raise task.exception()  # type: ignore[misc]


async def _cancelled(tasks: Sequence[asyncio.Future[Any]]) -> None:
    """Cancel `tasks` and wait until they are done. Their CancelledError is theirs: one
    that reaches the caller (it was cancelled meanwhile) is raised, never swallowed."""
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks)


async def until(stop: asyncio.Event, main: Job) -> None:
    """Run `main` until it returns or `stop` is set; then it is cancelled and awaited.
    Where an owner is told to stop by an event (a signal, a test), this turns it into
    the cancellation every task below understands. A failure of `main` is raised."""
    task = asyncio.ensure_future(main())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
    finally:
        await _cancelled([stopped, task])
    if not task.cancelled() and task.exception() is not None:
        raise task.exception()  # type: ignore[misc]


class Supervisor:
    """Named long-lived tasks in one TaskGroup: one can be replaced while the others run
    (a family on a config reload); a task that fails fails the group, and so the agent."""

    def __init__(self, group: asyncio.TaskGroup) -> None:
        self._group = group
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, name: str, job: Job) -> None:
        """Start `name`; one already running under that name is cancelled first."""
        old = self._tasks.pop(name, None)
        if old is not None:
            old.cancel()
        self._tasks[name] = self._group.create_task(job(), name=name)

    async def end(self, name: str) -> None:
        """Cancel `name` and wait until it has finished cleaning up."""
        task = self._tasks.pop(name, None)
        if task is None:
            return
        await _cancelled([task])


def cause(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The first failure in a task group (nested groups opened), to be raised as itself."""
    error: BaseException = group
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error
