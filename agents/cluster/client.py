"""The agent's asyncio client of the Kubernetes API: JSON calls, lists and `?watch=1`
streams over one pool of kept-alive connections (httpx) for the agent's life, with a
bearer token read afresh for each call, or a client certificate."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any, Self

from agents.cluster.access import Access
from agents.errors import AgentError

__all__ = [
    "Access",
    "ApiClient",
    "ApiError",
    "GoneError",
    "Listing",
    "UnreachableError",
    "WatchEvent",
]

REQUEST_TIMEOUT_S = 5.0  # connect, send and read one answer
WATCH_TIMEOUT_S = 300  # the server ends a watch after this; the caller watches again
# Longer than the reporter's resync: its calls every 30 s reuse one connection.
KEEPALIVE_S = 60.0
GONE = 410


class ApiError(AgentError):
    """The API server answered with an error status."""

    def __init__(self, status: int, method: str, path: str, detail: str) -> None:
        self.status = status
        super().__init__(f"{method} {path}: HTTP {status}: {detail}")


class GoneError(ApiError):
    """410: the resourceVersion a watch started from is older than the server keeps;
    list again and watch from the list's version."""


class UnreachableError(AgentError):
    """No answer from the API server: refused, reset, timed out or not HTTP."""


@dataclass(frozen=True)
class Listing:
    """A list's objects and the resourceVersion to watch from for what follows it."""

    items: list[dict[str, Any]]
    resource_version: str


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED or BOOKMARK
    object: dict[str, Any]

    @property
    def resource_version(self) -> str:
        meta = self.object.get("metadata")
        return str(meta.get("resourceVersion") or "") if isinstance(meta, dict) else ""


class ApiClient:
    """One per agent; `aclose` (or `async with`) ends its connections."""

    def __init__(self, access: Access, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        if access.server.startswith("https://") and access.tls is None:
            raise AgentError(f"{access.server}: https needs a TLS context")
        import httpx  # here, not at the top: a mode without the API server never loads it

        self.access = access
        self._timeout_s = timeout_s
        self._http = httpx.AsyncClient(
            base_url=access.server,
            verify=access.tls or False,  # False: plain http, no TLS to verify
            timeout=timeout_s,
            limits=httpx.Limits(max_keepalive_connections=4, keepalive_expiry=KEEPALIVE_S),
            headers={"Accept": "application/json", "User-Agent": "node-agent"},
            # The kubeconfig or the service account says where the API server is and
            # which CA to trust; proxy and CA variables of the environment do not.
            trust_env=False,
        )

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the kept connections; safe to call twice."""
        await self._http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        body: object = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One call; the answer's JSON object. Raises ApiError or UnreachableError."""
        import httpx

        headers = await self._headers()
        payload = None if body is None else json.dumps(body).encode()
        if payload is not None:
            headers["Content-Type"] = content_type
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._http.request(method, path, content=payload, headers=headers)
        except (httpx.HTTPError, TimeoutError) as exc:
            raise UnreachableError(f"{self.access.server}: {exc!r}") from exc
        if response.status_code >= 300:
            raise _error(response.status_code, method, path, response.content)
        return _json(response.content)

    async def list(self, path: str) -> Listing:
        """A collection's items and its resourceVersion."""
        answer = await self.request("GET", path)
        items = answer.get("items")
        meta = answer.get("metadata")
        version = meta.get("resourceVersion") if isinstance(meta, dict) else None
        return Listing(
            [i for i in items if isinstance(i, dict)] if isinstance(items, list) else [],
            str(version or ""),
        )

    async def watch(
        self,
        path: str,
        resource_version: str = "",
        timeout_s: int = WATCH_TIMEOUT_S,
        query: Mapping[str, str] | None = None,
    ) -> AsyncGenerator[WatchEvent, None]:
        """The changes to a collection after `resource_version` (from its list), with
        bookmarks, until the server ends the watch after `timeout_s`; `query` adds to the
        parameters (`fieldSelector`: the query of `path`, if any, is not kept). An ERROR line is
        raised: GoneError for 410 (list again), ApiError otherwise; UnreachableError for
        a connection lost. Close it (`contextlib.aclosing`) when leaving early."""
        import httpx

        params = {"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(timeout_s)}
        params.update(query or {})
        if resource_version:
            params["resourceVersion"] = resource_version
        # Lines may be minutes apart: only the end of the watch itself is awaited longer.
        timeout = httpx.Timeout(self._timeout_s, read=timeout_s + self._timeout_s)
        request = self._http.build_request(
            "GET", path, params=params, headers=await self._headers(), timeout=timeout
        )
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._http.send(request, stream=True)
        except (httpx.HTTPError, TimeoutError) as exc:
            raise UnreachableError(f"{self.access.server}: {exc!r}") from exc
        try:
            if response.status_code >= 300:
                raise _error(response.status_code, "GET", path, await response.aread())
            async for line in response.aiter_lines():
                if line.strip():
                    yield _watch_event(line, path)
        except httpx.HTTPError as exc:
            raise UnreachableError(f"{self.access.server}: watch {path}: {exc!r}") from exc
        finally:
            await response.aclose()

    async def _headers(self) -> dict[str, str]:
        token = self.access.token
        if self.access.token_file is not None:
            path = self.access.token_file
            try:
                token = (await asyncio.to_thread(path.read_text)).strip()
            except OSError as exc:
                raise UnreachableError(f"token {path}: {exc}") from exc
        return {"Authorization": f"Bearer {token}"} if token else {}


def _watch_event(line: str, path: str) -> WatchEvent:
    try:
        event = json.loads(line)
    except ValueError as exc:
        raise UnreachableError(f"watch {path}: not a JSON line: {line[:80]!r}") from exc
    kind, obj = event.get("type"), event.get("object")
    if not isinstance(obj, dict):
        raise UnreachableError(f"watch {path}: no object in {line[:80]!r}")
    if kind == "ERROR":
        code = obj.get("code")
        raise _error(code if isinstance(code, int) else 500, "WATCH", path, line.encode())
    return WatchEvent(str(kind), obj)


def _error(status: int, method: str, path: str, data: bytes) -> ApiError:
    answer = _json(data)
    obj = answer.get("object") if answer.get("type") == "ERROR" else answer
    message = obj.get("message") if isinstance(obj, dict) else None
    detail = str(message or data[:200].decode(errors="replace"))
    return (GoneError if status == GONE else ApiError)(status, method, path, detail)


def _json(data: bytes) -> dict[str, Any]:
    if not data.strip():
        return {}
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
