"""Events on pods through the API-server stand-in: one posted per `post`, on the pod in
its own namespace, retried through an API server that fails for a while, and one the
API server refuses for good dropped without holding up the next."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from agents.cluster.client import ApiClient
from agents.cluster.pod_events import PodEvent, PodEvents
from tests.conditions import async_wait_until
from tests.standin.apiserver import ApiServer

EVENT = PodEvent("team-a", "trainer-0", "uid-0", "GPUShareExceeded", "over its share")


@contextlib.asynccontextmanager
async def sending(client: ApiClient) -> AsyncIterator[PodEvents]:
    events = PodEvents("node-1", client, first_retry_s=0.01, max_retry_s=0.05)
    task = asyncio.create_task(events.run())
    try:
        yield events
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def stored(server: ApiServer) -> list[dict[str, object]]:
    return list(server.store.events.values())


async def test_an_event_on_a_pod_is_made_once_through_an_api_server_failing_a_while(
    server: ApiServer, client: ApiClient
) -> None:
    server.fail_next(503, times=3, method="POST")
    async with sending(client) as events:
        events.post(EVENT)
        await async_wait_until(lambda: stored(server), 5.0, "the Event made")
        [event] = stored(server)
        assert event["metadata"]["namespace"] == "team-a"  # type: ignore[index]
        assert event["involvedObject"] == {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": "team-a",
            "name": "trainer-0",
            "uid": "uid-0",
        }
        assert (event["reason"], event["type"], event["count"]) == (
            "GPUShareExceeded",
            "Warning",
            1,
        )
        assert event["source"] == {"component": "node-agent", "host": "node-1"}


async def test_an_event_refused_for_good_does_not_hold_up_the_next(
    server: ApiServer, client: ApiClient
) -> None:
    server.fail_next(422, times=1, method="POST")
    async with sending(client) as events:
        events.post(EVENT)
        events.post(PodEvent("team-b", "p", "uid-1", "GPUShareExceeded", "second"))
        await async_wait_until(lambda: stored(server), 5.0, "the second Event made")
        assert [e["message"] for e in stored(server)] == ["second"]
