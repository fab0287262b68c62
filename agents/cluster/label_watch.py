"""One label of this node's Node object, read once and then followed by a watch that is
opened again when the server ends it, and retried with backoff while the API server does
not answer."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import structlog

from agents.cluster.client import ApiClient, ApiError, GoneError, UnreachableError

log = structlog.get_logger(__name__)

NODES = "/api/v1/nodes"
RETRY_S = (1.0, 2.0, 5.0, 10.0, 30.0)  # then every 30 s until the API server answers


def label_of(node: dict[str, Any], key: str) -> str | None:
    """The value of label `key` on a Node object; None when it has none."""
    meta = node.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    value = labels.get(key) if isinstance(labels, dict) else None
    return value if isinstance(value, str) else None


async def read_label(client: ApiClient, node: str, key: str) -> tuple[str | None, str]:
    """The label's value now and the Node's resourceVersion to watch from. Raises
    ApiError or UnreachableError."""
    found = await client.request("GET", f"{NODES}/{node}")
    meta = found.get("metadata")
    version = meta.get("resourceVersion") if isinstance(meta, dict) else None
    return label_of(found, key), str(version or "")


async def follow_label(
    client: ApiClient,
    node: str,
    key: str,
    seen: Callable[[str | None], None],
    retry_s: tuple[float, ...] = RETRY_S,
) -> None:
    """Call `seen` (on the loop) with the label's value, then with each new value, until
    cancelled. Nothing else of the Node calls it: its status changes every few seconds."""
    delays, unreachable = iter(retry_s), False
    while True:
        try:
            value, version = await read_label(client, node, key)
            if unreachable:
                log.info("node_label_watched", node=node, label=key)
            delays, unreachable = iter(retry_s), False
            seen(value)
            await _watch(client, node, key, version=version, value=value, seen=seen)
        except GoneError:
            continue  # read again, and watch from there
        except (ApiError, UnreachableError) as exc:
            delay = next(delays, retry_s[-1])
            if not unreachable:  # one line per outage, not per retry
                log.warning("node_label_unwatched", node=node, label=key, error=str(exc))
            unreachable = True
            await asyncio.sleep(delay)


async def _watch(
    client: ApiClient,
    node: str,
    key: str,
    *,
    version: str,
    value: str | None,
    seen: Callable[[str | None], None],
) -> None:
    query = {"fieldSelector": f"metadata.name={node}"}
    while True:
        events = client.watch(NODES, version, query=query)
        async with contextlib.aclosing(events):
            async for event in events:
                version = event.resource_version or version
                if event.type not in ("ADDED", "MODIFIED"):
                    continue  # a BOOKMARK; a deleted Node keeps the config it had
                if event.object.get("metadata", {}).get("name") != node:
                    continue
                now = label_of(event.object, key)
                if now != value:
                    value = now
                    seen(value)
