"""The API client against the API-server stand-in over real HTTP: one kept connection for
many calls and a rotated token, lists and watches (changes, bookmarks, 410 Gone), an
API server that goes away and comes back, and the reporter closing its connections."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agents.cluster.client import (
    Access,
    ApiClient,
    ApiError,
    GoneError,
    UnreachableError,
    WatchEvent,
)
from agents.cluster.reporter import Reporter
from agents.core.health import DeviceHealth, GpuLost
from agents.tasks import until
from tests.conditions import WAIT, async_wait_until
from tests.standin.apiserver import HANG, REFUSE, UP, ApiServer

NODE = "node-1"
EVENTS = "/api/v1/namespaces/default/events"
STRATEGIC = "application/strategic-merge-patch+json"


def _event(name: str) -> dict[str, object]:
    return {
        "metadata": {"name": name},
        "involvedObject": {"kind": "Node", "name": NODE},
        "reason": "DeviceUnhealthy",
        "count": 1,
    }


async def _take(events: AsyncIterator[WatchEvent], n: int) -> list[WatchEvent]:
    """The next `n` events of a watch, within the deadline."""
    async with asyncio.timeout(WAIT):
        return [await anext(events) for _ in range(n)]


async def test_many_calls_and_a_rotated_token_share_one_connection(
    server: ApiServer, tmp_path: Path
) -> None:
    token = tmp_path / "token"
    token.write_text("first\n")
    async with ApiClient(Access(server.url, token_file=token)) as client:
        for _ in range(10):
            await client.request("GET", f"/api/v1/nodes/{NODE}")
        token.write_text("second\n")  # rotated in place, as the kubelet does
        await client.request("PATCH", f"/api/v1/nodes/{NODE}/status", {}, STRATEGIC)
    assert [c.token for c in server.calls] == ["first"] * 10 + ["second"]
    assert server.connections == 1


async def test_a_list_gives_the_version_to_watch_from(server: ApiServer, client: ApiClient) -> None:
    await client.request("POST", EVENTS, _event("e1"))
    listing = await client.list(EVENTS)
    assert [e["metadata"]["name"] for e in listing.items] == ["e1"]
    assert listing.resource_version == str(server.store.version)


async def test_a_watch_sees_events_added_modified_and_deleted_after_its_version(
    server: ApiServer, client: ApiClient
) -> None:
    since = (await client.list(EVENTS)).resource_version
    # Made before the watch starts: the version, not the timing, says what it sees.
    await client.request("POST", EVENTS, _event("e1"))
    async with contextlib.aclosing(client.watch(EVENTS, since)) as events:
        await client.request("PATCH", f"{EVENTS}/e1", {"count": 2}, STRATEGIC)
        await client.request("DELETE", f"{EVENTS}/e1")
        seen = await _take(events, 3)
    assert [(e.type, e.object["metadata"]["name"]) for e in seen] == [
        ("ADDED", "e1"),
        ("MODIFIED", "e1"),
        ("DELETED", "e1"),
    ]
    assert seen[1].object["count"] == 2
    versions = [int(e.resource_version) for e in seen]
    assert versions == sorted(versions) and versions[0] > int(since)


async def test_a_node_watch_sees_its_status_patched(server: ApiServer, client: ApiClient) -> None:
    since = (await client.list("/api/v1/nodes")).resource_version
    condition = {"type": "DevicesHealthy", "status": "False"}
    async with contextlib.aclosing(client.watch("/api/v1/nodes", since)) as events:
        await client.request(
            "PATCH",
            f"/api/v1/nodes/{NODE}/status",
            {"status": {"conditions": [condition]}},
            STRATEGIC,
        )
        [seen] = await _take(events, 1)
    assert (seen.type, seen.object["metadata"]["name"]) == ("MODIFIED", NODE)
    assert condition in seen.object["status"]["conditions"]


async def test_an_idle_watch_gets_bookmarks_and_ends_at_its_timeout(
    server: ApiServer, client: ApiClient
) -> None:
    server.bookmark_s = 0.1
    since = (await client.list(EVENTS)).resource_version
    async with asyncio.timeout(WAIT):
        seen = [e async for e in client.watch(EVENTS, since, timeout_s=1)]
    assert seen and {e.type for e in seen} == {"BOOKMARK"}
    assert seen[-1].resource_version == str(server.store.version)


async def test_a_watch_from_a_compacted_version_is_gone_and_a_relist_recovers(
    server: ApiServer, client: ApiClient
) -> None:
    since = (await client.list(EVENTS)).resource_version
    await client.request("POST", EVENTS, _event("e1"))
    server.store.compact()
    with pytest.raises(GoneError) as gone:
        await _take(client.watch(EVENTS, since), 1)
    assert gone.value.status == 410
    listing = await client.list(EVENTS)
    async with contextlib.aclosing(client.watch(EVENTS, listing.resource_version)) as events:
        await client.request("POST", EVENTS, _event("e2"))
        [seen] = await _take(events, 1)
    assert (seen.type, seen.object["metadata"]["name"]) == ("ADDED", "e2")


async def test_a_watch_answered_410_outright_is_gone_too(
    server: ApiServer, client: ApiClient
) -> None:
    server.fail_next(410, method="GET")
    with pytest.raises(GoneError):
        await _take(client.watch(EVENTS, "1"), 1)
    server.fail_next(403, method="GET")
    with pytest.raises(ApiError) as refused:
        await _take(client.watch(EVENTS, "1"), 1)
    assert refused.value.status == 403 and not isinstance(refused.value, GoneError)


@pytest.mark.parametrize("outage", [REFUSE, HANG])
async def test_an_api_server_that_goes_away_and_comes_back_does_not_wedge_the_client(
    server: ApiServer, client: ApiClient, outage: str
) -> None:
    await client.request("GET", f"/api/v1/nodes/{NODE}")
    since = (await client.list(EVENTS)).resource_version
    async with contextlib.aclosing(client.watch(EVENTS, since)) as events:
        await client.request("POST", EVENTS, _event("e1"))
        await _take(events, 1)
        await server.set_mode(outage)
        async with asyncio.timeout(WAIT):  # each call gives up within its own timeout
            with pytest.raises(UnreachableError):
                await client.request("GET", f"/api/v1/nodes/{NODE}")
            with pytest.raises(UnreachableError):
                await _take(client.watch(EVENTS, since), 1)
            if outage == REFUSE:  # the watch's connection went with the server
                with pytest.raises(UnreachableError):
                    await anext(events)
    await server.set_mode(UP)
    async with asyncio.timeout(WAIT):
        node = await client.request("GET", f"/api/v1/nodes/{NODE}")
        assert node["metadata"]["name"] == NODE
        async with contextlib.aclosing(client.watch(EVENTS, since)) as events:
            [seen] = await _take(events, 1)
    assert (seen.type, seen.object["metadata"]["name"]) == ("ADDED", "e1")


async def test_the_reporter_keeps_one_connection_and_closes_it_when_it_ends(
    server: ApiServer,
) -> None:
    reporter = Reporter(NODE, ApiClient(Access(server.url)), settle_s=0)
    stop = asyncio.Event()
    bad = DeviceHealth("nvidia.com/gpu", "GPU-1", "GPU 1", GpuLost())
    task = asyncio.ensure_future(until(stop, lambda: reporter.run(lambda: [bad])))
    reporter.changed(bad)
    try:
        await async_wait_until(lambda: len(server.store.events) == 1, WAIT)
        await async_wait_until(
            lambda: server.store.condition(NODE, "DevicesHealthy") is not None, WAIT
        )
        assert len(server.calls) >= 3  # read the node, patch its condition, make the Event
        assert (server.connections, server.open_connections) == (1, 1)
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT)
    await async_wait_until(lambda: server.open_connections == 0, WAIT)
