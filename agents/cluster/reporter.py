"""Tells the API server about device health: Events on the Node and its `DevicesHealthy`
and `DevicesDegraded` conditions. Families hand changes over without ever waiting; the
calls run in the reporter's own task, with retries and backoff, so a slow or absent API
server delays no RPC and no health update to the kubelet."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from datetime import UTC, datetime

import structlog

from agents.cluster.client import ApiClient, ApiError, UnreachableError
from agents.core.health import DeviceHealth
from agents.core.node_report import (
    CONDITION_TYPE,
    DEGRADED_TYPE,
    Condition,
    EventBook,
    EventRecord,
    conditions_of,
    note_of,
)

log = structlog.get_logger(__name__)

COMPONENT = "node-agent"
EVENT_NAMESPACE = "default"  # where the kubelet puts its Node events too
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 10.0
# The families' first health pass (a GPU lost before the start, a link already down)
# ends within this: the first condition says so, rather than True for a moment.
SETTLE_S = 2.0
# The condition is also checked this often: a device that left the node (no health
# change) leaves its message.
RESYNC_S = 30.0
STRATEGIC = "application/strategic-merge-patch+json"
OWNED = (CONDITION_TYPE, DEGRADED_TYPE)  # the Node conditions the agent sets, no other
REFUSED_FOR_GOOD = (400, 413, 415, 422)  # the Event itself is wrong: retrying repeats it


def rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reporter:
    """One per agent; `changed` is called on the event loop by the families."""

    def __init__(
        self,
        node: str,
        client: ApiClient,
        *,
        now: Callable[[], str] = rfc3339,
        first_retry_s: float = FIRST_RETRY_S,
        max_retry_s: float = MAX_RETRY_S,
        settle_s: float = SETTLE_S,
    ) -> None:
        self.node = node
        self._client = client
        self._now = now
        self._first_retry_s, self._max_retry_s = first_retry_s, max_retry_s
        self._settle_s = settle_s
        self.book = EventBook(f"{node}.{os.urandom(4).hex()}")
        self._wake = asyncio.Event()
        self._conditions: dict[str, Condition] = {}  # by type, as the API server has them
        self._since: dict[str, str] = {}  # their lastTransitionTime
        self._known = False  # the node's conditions were read once
        self._current: Callable[[], list[DeviceHealth]] = list
        self.reachable: bool | None = None  # None until the first call ends

    def changed(self, change: DeviceHealth) -> None:
        """Count a health change into its Event and wake the reporter. Never blocks."""
        self.book.add(note_of(change), self._now())
        self._wake.set()

    async def run(self, current: Callable[[], list[DeviceHealth]]) -> None:
        """Keep the API server true to `current()` and the changes until cancelled."""
        self._current = current
        log.info("cluster_reports", node=self.node, api=self._client.access.server)
        try:
            await self._loop()
        except Exception:  # the reports are optional to the agent: never end it
            log.exception("cluster_reports_failed", effect="device plugins keep serving")
        finally:
            await self._client.aclose()  # the reporter owns its client's connections

    async def _loop(self) -> None:
        delay = self._first_retry_s
        await asyncio.sleep(self._settle_s)
        while True:
            self._wake.clear()
            try:
                await self._sync()
            except (ApiError, UnreachableError) as exc:
                self._failed(exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_retry_s)
                continue
            if self.reachable is False:
                log.info("cluster_reachable", api=self._client.access.server)
            self.reachable, delay = True, self._first_retry_s
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RESYNC_S):
                    await self._wake.wait()

    def _failed(self, exc: Exception) -> None:
        if self.reachable is not False:  # one line per outage, not per retry
            log.warning(
                "cluster_unreachable",
                api=self._client.access.server,
                error=str(exc),
                effect="retrying with backoff; device plugins keep serving",
            )
        self.reachable = False

    async def _sync(self) -> None:
        await self._sync_condition()
        for record in self.book.unsent():
            try:
                await self._send(record)
            except ApiError as exc:
                if exc.status not in REFUSED_FOR_GOOD:
                    raise
                # Sending it again cannot help, and it must not hold up the others.
                log.error("event_refused", name=record.name, error=str(exc))
                record.sent_count = record.count

    async def _sync_condition(self) -> None:
        path = f"/api/v1/nodes/{self.node}/status"
        if not self._known:
            # An empty patch answers with the node: the agent may patch the status but
            # not read it, and a condition that kept its status keeps its transition time.
            self._read_condition(await self._client.request("PATCH", path, {}, STRATEGIC))
            self._known = True
        wanted = conditions_of(self._current())
        changed = {t: c for t, c in wanted.items() if self._conditions.get(t) != c}
        if not changed:
            return
        now, bodies = self._now(), []
        for kind, condition in changed.items():
            had, since = self._conditions.get(kind), self._since.get(kind, "")
            if had is None or condition.status != had.status or not since:
                since = now
            bodies.append(_condition_body(kind, condition, now, since))
        await self._client.request("PATCH", path, {"status": {"conditions": bodies}}, STRATEGIC)
        for body in bodies:
            kind = body["type"]
            self._conditions[kind], self._since[kind] = changed[kind], body["lastTransitionTime"]
            log.info("node_condition_set", type=kind, status=body["status"])

    def _read_condition(self, node: dict[str, object]) -> None:
        """What the node holds from an earlier run: a condition's transition time stays if
        its status does."""
        status = node.get("status")
        conditions = status.get("conditions") if isinstance(status, dict) else None
        for c in conditions if isinstance(conditions, list) else []:
            kind = c.get("type") if isinstance(c, dict) else None
            if kind in OWNED:
                self._conditions[kind] = Condition(
                    str(c.get("status")), str(c.get("reason")), str(c.get("message"))
                )
                self._since[kind] = str(c.get("lastTransitionTime") or "")

    async def _send(self, record: EventRecord, fallback: bool = True) -> None:
        """Create the record's Event or patch its count. An Event the API server expired
        (404) is made anew, a create that already happened (409) becomes a patch: once
        per call, so that an API server answering both ways cannot loop."""
        count = record.count
        base = f"/api/v1/namespaces/{EVENT_NAMESPACE}/events"
        try:
            if record.created:
                patch = {
                    "count": count,
                    "lastTimestamp": record.last,
                    "message": record.note.message,
                }
                await self._client.request("PATCH", f"{base}/{record.name}", patch, STRATEGIC)
            else:
                await self._client.request("POST", base, self._event_body(record))
        except ApiError as exc:
            if not fallback or exc.status not in (404, 409):
                raise
            if exc.status == 404:
                self.book.renew(record)
            else:
                record.created = True
            await self._send(record, fallback=False)
            return
        record.created, record.sent_count = True, count

    def _event_body(self, record: EventRecord) -> dict[str, object]:
        note = record.note
        # The kubelet's own Node events carry the node's name as UID; so do these, and
        # `kubectl describe node` finds both.
        node = {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": self.node}
        return event_body(
            record.name,
            EVENT_NAMESPACE,
            node,
            said=(note.type, note.reason, note.message),
            seen=(record.count, record.first, record.last),
            node=self.node,
        )


def event_body(
    name: str,
    namespace: str,
    involved: dict[str, str],
    *,
    said: tuple[str, str, str],
    seen: tuple[int, str, str],
    node: str,
) -> dict[str, object]:
    """An Event `name` in `namespace` about `involved`, `said` as (type, reason, message),
    `seen` (count, first, last) times, from this agent on `node`."""
    kind, reason, message = said
    count, first, last = seen
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": namespace},
        "involvedObject": involved,
        "type": kind,
        "reason": reason,
        "message": message,
        "count": count,
        "firstTimestamp": first,
        "lastTimestamp": last,
        "source": {"component": COMPONENT, "host": node},
        "reportingComponent": COMPONENT,
        "reportingInstance": node,
    }


def _condition_body(kind: str, condition: Condition, now: str, since: str) -> dict[str, str]:
    return {
        "type": kind,
        "status": condition.status,
        "reason": condition.reason,
        "message": condition.message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": since,
    }
