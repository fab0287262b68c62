"""The zeros a device plugin leaves in its Node's capacity: the kubelet keeps a resource
whose plugin is gone at 0, for good, and the scheduler then takes that resource for a
device plugin's and never serves it through a DeviceClass's extendedResourceName. A node
moved to DRA mode has no device plugin of ours: those zeros are removed, whenever they
appear."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Collection

import structlog

from agents.cluster.client import ApiClient, ApiError, GoneError, UnreachableError

log = structlog.get_logger(__name__)

JSON_PATCH = "application/json-patch+json"
NODES = "/api/v1/nodes"
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # then every 30 s until the API server answers
FIELDS = ("capacity", "allocatable")


def stale_zeros(node: dict[str, object], ours: Callable[[str], bool]) -> list[str]:
    """Our resource names that the Node's capacity and allocatable both hold at 0."""
    status = node.get("status")
    if not isinstance(status, dict):
        return []
    tables = [status.get(f) for f in FIELDS]
    if not all(isinstance(t, dict) for t in tables):
        return []
    capacity, allocatable = tables
    assert isinstance(capacity, dict) and isinstance(allocatable, dict)
    return sorted(
        name
        for name, value in capacity.items()
        if ours(name) and str(value) == "0" and str(allocatable.get(name, "0")) == "0"
    )


def _escaped(name: str) -> str:
    return name.replace("~", "~0").replace("/", "~1")


async def clear_stale_zeros(client: ApiClient, node: str, prefixes: Collection[str]) -> None:
    """Keep `node`'s status free of the device-plugin zeros of resources under `prefixes`,
    until cancelled: its Node is listed, then watched (the kubelet writes such a zero
    when a plugin has been gone for its grace period, minutes after a switch to DRA).
    A watch is the only request while nothing changes; retried while the API server
    does not answer."""

    def ours(name: str) -> bool:
        return any(name.startswith(p) for p in prefixes)

    query = {"fieldSelector": f"metadata.name={node}"}
    delays = iter(RETRY_S)
    while True:
        try:
            listing = await client.list(f"{NODES}?fieldSelector=metadata.name%3D{node}")
            for found in listing.items:
                await _clear(client, node, stale_zeros(found, ours))
            version = listing.resource_version
            delays = iter(RETRY_S)
            while True:
                events = client.watch(NODES, version, query=query)
                async with contextlib.aclosing(events):
                    async for event in events:
                        version = event.resource_version or version
                        if event.type in ("ADDED", "MODIFIED"):
                            await _clear(client, node, stale_zeros(event.object, ours))
        except GoneError:
            continue  # list again
        except (ApiError, UnreachableError) as exc:
            delay = next(delays, RETRY_S[-1])
            log.warning("device_plugin_capacity_unchecked", error=str(exc), retry_in_s=delay)
            await asyncio.sleep(delay)


async def _clear(client: ApiClient, node: str, names: list[str]) -> None:
    if not names:
        return
    patch = [
        op
        for name in names
        for f in FIELDS
        for op in (
            {"op": "test", "path": f"/status/{f}/{_escaped(name)}", "value": "0"},
            {"op": "remove", "path": f"/status/{f}/{_escaped(name)}"},
        )
    ]
    await client.request("PATCH", f"{NODES}/{node}/status", patch, JSON_PATCH)
    log.info(
        "device_plugin_capacity_removed",
        node=node,
        resources=names,
        reason="left at 0 by a device plugin that no longer runs here",
    )
