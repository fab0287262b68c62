"""Events on pods (a pod over its GPU share): `post` queues one and returns at once; `run`
sends them in its own task, retrying with backoff, so a slow or absent API server holds
up nothing else."""

from __future__ import annotations

import asyncio
import os
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from agents.cluster.client import ApiClient, ApiError, UnreachableError
from agents.cluster.reporter import (
    FIRST_RETRY_S,
    MAX_RETRY_S,
    REFUSED_FOR_GOOD,
    event_body,
    rfc3339,
)

log = structlog.get_logger(__name__)

ALREADY_MADE = 409
QUEUE_MAX = 256  # unsent Events kept while the API server is away; the oldest go first


@dataclass(frozen=True)
class PodEvent:
    namespace: str
    pod: str
    pod_uid: str
    reason: str  # e.g. GPUShareExceeded
    message: str
    type: str = "Warning"


class PodEvents:
    """One sender of Events on this node's pods, through `client` (not closed here)."""

    def __init__(
        self,
        node: str,
        client: ApiClient,
        *,
        now: Callable[[], str] = rfc3339,
        first_retry_s: float = FIRST_RETRY_S,
        max_retry_s: float = MAX_RETRY_S,
    ) -> None:
        self.node = node
        self._client = client
        self._now = now
        self._first_retry_s, self._max_retry_s = first_retry_s, max_retry_s
        # (event, its time, its name): a retry after a lost answer repeats the name, and
        # the API server's 409 then says it was made.
        self._queue: deque[tuple[PodEvent, str, str]] = deque(maxlen=QUEUE_MAX)
        self._wake = asyncio.Event()

    def post(self, event: PodEvent) -> None:
        """Queue the Event (timestamped now) and wake the sender. Never blocks."""
        self._queue.append((event, self._now(), f"{event.pod}.{os.urandom(8).hex()}"))
        self._wake.set()

    async def run(self) -> None:
        """Send queued Events until cancelled."""
        delay = self._first_retry_s
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._queue:
                event, at, name = self._queue[0]
                path = f"/api/v1/namespaces/{event.namespace}/events"
                try:
                    await self._client.request("POST", path, self._body(event, at, name))
                except ApiError as exc:
                    if exc.status not in (*REFUSED_FOR_GOOD, ALREADY_MADE):
                        delay = await self._backoff(exc, delay)
                        continue
                    if exc.status != ALREADY_MADE:
                        log.error("pod_event_refused", pod=event.pod, error=str(exc))
                except UnreachableError as exc:
                    delay = await self._backoff(exc, delay)
                    continue
                self._queue.popleft()
                delay = self._first_retry_s
                log.info(
                    "pod_event_sent", reason=event.reason, pod=f"{event.namespace}/{event.pod}"
                )

    async def _backoff(self, exc: Exception, delay: float) -> float:
        log.warning("pod_event_unsent", error=str(exc), retry_s=delay)
        await asyncio.sleep(delay)
        return min(delay * 2, self._max_retry_s)

    def _body(self, event: PodEvent, at: str, name: str) -> dict[str, object]:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": event.namespace,
            "name": event.pod,
            "uid": event.pod_uid,
        }
        said = (event.type, event.reason, event.message)
        return event_body(name, event.namespace, pod, said=said, seen=(1, at, at), node=self.node)
