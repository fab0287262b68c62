"""An API-server stand-in on a loopback port: the paths, JSON and status codes the agent
uses (Events, `nodes/{name}/status` patches, `resource.k8s.io/v1` ResourceSlices and
ResourceClaims, lists with selectors and `?watch=1` streams), kept-alive connections and
requests per verb that it counts, injected errors, a slow answer, and the two ways a real
one is unreachable: connections refused, and connections that never get an answer.

`python -m tests.standin.apiserver --port N [--node NAME] [--mode up|refuse|hang]`
serves until killed (the bench runs it so)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import ssl
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import yaml

from tests.standin.apistore import JSON_PATCH, Match, Obj, StatusError, Store, everything

UP, REFUSE, HANG = "up", "refuse", "hang"
NODES_PATH = re.compile(r"^/api/v1/nodes(?:/([^/]+)(/status)?)?$")
EVENTS_PATH = re.compile(r"^/api/v1/(?:namespaces/([^/]+)/)?events(?:/([^/]+))?$")
SLICES_PATH = re.compile(r"^/apis/resource\.k8s\.io/v1/resourceslices(?:/([^/]+))?$")
CLAIMS_PATH = re.compile(
    r"^/apis/resource\.k8s\.io/v1/(?:namespaces/([^/]+)/)?resourceclaims(?:/([^/]+))?$"
)
RESOURCE = re.compile(r"^/apis?/(?:[^/]+/)*?(?:namespaces/[^/]+/)?([a-z]+)(?:/([^/]+)(/\w+)?)?$")
SLICE_FIELDS = {
    "metadata.name": ("metadata", "name"),
    "spec.nodeName": ("spec", "nodeName"),
    "spec.driver": ("spec", "driver"),
}
WATCH_TIMEOUT_S = 1800.0  # a watch without timeoutSeconds ends after this
BOOKMARK_S = 1.0  # how often an idle watch that allows them gets a BOOKMARK


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    content_type: str
    code: int
    token: str = ""  # the bearer token it came with
    watch: bool = False

    @property
    def resource(self) -> str:
        """What it was about: "nodes", "nodes/status", "resourceslices", ..."""
        m = RESOURCE.match(self.path)
        return (m.group(1) + (m.group(3) or "")) if m else self.path

    @property
    def verb(self) -> str:
        """The API server's word for it: get, list, watch, create, update, patch, delete."""
        m = RESOURCE.match(self.path)
        named = bool(m and m.group(2))
        if self.method == "GET":
            return "watch" if self.watch else "get" if named else "list"
        verbs = {"POST": "create", "PUT": "update", "PATCH": "patch"}
        return verbs.get(self.method, "delete" if named else "deletecollection")


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query
    query: dict[str, str]
    content_type: str
    body: object
    close: bool  # the client asked for `Connection: close`
    token: str

    def call(self, code: int) -> Call:
        watch = self.query.get("watch") in ("1", "true")
        return Call(self.method, self.path, self.content_type, code, self.token, watch)


class ApiServer:
    def __init__(
        self, nodes: tuple[str, ...] = ("node-1",), port: int = 0, tls: ssl.SSLContext | None = None
    ) -> None:
        self.tls = tls  # https with this context; None: plain http
        self.store = Store()
        for name in nodes:
            self.store.add_node(name)
        self.store.listeners.append(self._wake_watches)
        self.calls: list[Call] = []
        self.connections = 0  # accepted; over TLS each one is a completed handshake
        self.mode = UP
        self.port = port
        self.bookmark_s = BOOKMARK_S
        self.bookmarks = 0  # BOOKMARK events sent, on every watch
        self.delay_s = 0.0  # a slow API server: each answer waits this long
        self._failures: deque[tuple[int, str | None]] = deque()
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._held: set[asyncio.StreamWriter] = set()
        self._watches: set[asyncio.Event] = set()
        self._handlers: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def count(self, verb: str, resource: str) -> int:
        """How many requests of `verb` on `resource` were answered."""
        return sum(1 for c in self.calls if c.verb == verb and c.resource == resource)

    @property
    def open_connections(self) -> int:
        return len(self._open)

    @property
    def watching(self) -> int:
        """Watches streaming now."""
        return len(self._watches)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close the listener and every connection, and wait for their handlers."""
        await self._close_listener()
        self._drop(self._open)
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=5.0)

    def fail_next(self, code: int, times: int = 1, method: str | None = None) -> None:
        """Answer the next `times` calls (of `method`, if given) with `code`."""
        self._failures.extend([(code, method)] * times)

    async def set_mode(self, mode: str) -> None:
        """up: answer; refuse: nothing listens on the port and the open connections are
        gone, as of a server that went away; hang: accept, never answer."""
        if mode == REFUSE:
            await self._close_listener()
            self._drop(self._open)
        elif self._server is None:
            await self.start()
        if mode != HANG:
            self._drop(self._held)
        self.mode = mode

    async def _close_listener(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def _drop(self, writers: set[asyncio.StreamWriter]) -> None:
        for writer in list(writers):
            writer.close()
        self._wake_watches()  # theirs may be among them

    def _wake_watches(self) -> None:
        for wake in self._watches:
            wake.set()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._open.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)
        try:
            while (request := await _read_request(reader)) is not None:
                if self.mode == HANG:
                    self._held.add(writer)
                    await reader.read()  # until the client gives up or the mode changes
                    return
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                watched = _watched(request)
                if watched is not None:
                    await self._watch(request, watched, reader, writer)
                else:
                    await self._reply(request, writer)
                if request.close:
                    return
        except (OSError, ValueError, asyncio.IncompleteReadError):
            pass  # a client gone midway
        finally:
            self._open.discard(writer)
            self._held.discard(writer)
            writer.close()

    async def _reply(self, request: Request, writer: asyncio.StreamWriter) -> None:
        await self._send(request, writer, *self._answer(request))

    async def _send(
        self, request: Request, writer: asyncio.StreamWriter, code: int, body: Obj
    ) -> None:
        self.calls.append(request.call(code))
        data = json.dumps(body).encode()
        head = (
            f"HTTP/1.1 {code} {'OK' if code < 300 else 'Error'}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"{'Connection: close' if request.close else 'Connection: keep-alive'}\r\n\r\n"
        )
        writer.write(head.encode() + data)
        await writer.drain()

    def _answer(self, request: Request) -> tuple[int, Obj]:
        try:
            self._injected(request.method)
            json_patch = request.content_type == JSON_PATCH and isinstance(request.body, list)
            if (
                not isinstance(request.body, dict)
                and request.method in ("POST", "PATCH")
                and not json_patch
            ):
                raise StatusError(400, "BadRequest", "the body is no JSON object")
            if request.path.startswith("/apis/"):
                return self._resources(request)
            return self._route(request)
        except StatusError as exc:
            return exc.code, exc.status()

    def _injected(self, method: str) -> None:
        for i, (code, only) in enumerate(self._failures):
            if only in (None, method):
                del self._failures[i]
                raise StatusError(code, "InternalError" if code >= 500 else "Injected", "injected")

    def _route(self, request: Request) -> tuple[int, Obj]:
        method, path = request.method, request.path
        patch = request.body if isinstance(request.body, dict) else {}
        if m := NODES_PATH.match(path):
            return self._nodes(request, m.group(1), bool(m.group(2)))
        if m := EVENTS_PATH.match(path):
            namespace, name = m.group(1), m.group(2)
            if method == "GET" and name is None:
                return 200, self.store.event_list(namespace)
            if namespace is None:
                pass  # /api/v1/events lists only
            elif method == "POST" and name is None:
                return 201, self.store.create_event(namespace, patch)
            elif method == "PATCH" and name is not None:
                return 200, self.store.patch_event(namespace, name, patch, request.content_type)
            elif method == "DELETE" and name is not None:
                return 200, self.store.delete_event(namespace, name)
        raise StatusError(404, "NotFound", f"the server could not find {method} {path}")

    def _nodes(self, request: Request, name: str | None, status: bool) -> tuple[int, Obj]:
        method, body = request.method, request.body
        if method == "GET":
            return 200, self.store.node(name) if name else self.store.node_list()
        if method == "PATCH" and name and status:
            patch = body if request.content_type == JSON_PATCH or isinstance(body, dict) else {}
            return 200, self.store.patch_node_status(name, patch, request.content_type)
        if method == "PATCH" and name:
            return 200, self.store.patch_node(name, body, request.content_type)
        raise StatusError(404, "NotFound", f"the server could not find {method} {request.path}")

    def _resources(self, request: Request) -> tuple[int, Obj]:
        """The `resource.k8s.io/v1` paths: ResourceSlices, and reading ResourceClaims."""
        method, path = request.method, request.path
        if m := SLICES_PATH.match(path):
            return self._slices(request, m.group(1))
        if (m := CLAIMS_PATH.match(path)) and method == "GET" and m.group(1) and m.group(2):
            return 200, self.store.claim(m.group(1), m.group(2))
        raise StatusError(404, "NotFound", f"the server could not find {method} {path}")

    def _slices(self, request: Request, name: str | None) -> tuple[int, Obj]:
        method, body = request.method, request.body if isinstance(request.body, dict) else {}
        if name is None:
            if method == "GET":
                return 200, self.store.slice_list(_selected(request))
            if method == "POST":
                return 201, self.store.create_slice(body)
        elif method == "GET":
            return 200, self.store.slice(name)
        elif method == "PUT":
            if not isinstance(request.body, dict):
                raise StatusError(400, "BadRequest", "the body is no JSON object")
            return 200, self.store.update_slice(name, body)
        elif method == "DELETE":
            return 200, self.store.delete_slice(name)
        raise StatusError(405, "MethodNotAllowed", f"the server does not allow {method}")

    async def _watch(
        self,
        request: Request,
        watched: tuple[str, str | None, Match],
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """A `?watch=1` stream of JSON lines until timeoutSeconds, either side closing,
        or a 410 for a resourceVersion older than the history kept."""
        kind, namespace, match = watched
        try:
            self._injected(request.method)
        except StatusError as exc:
            await self._send(request, writer, exc.code, exc.status())
            return
        self.calls.append(request.call(200))
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(request.query.get("timeoutSeconds", WATCH_TIMEOUT_S))
        bookmarks = request.query.get("allowWatchBookmarks") == "true"
        since = request.query.get("resourceVersion", "")
        if since in ("", "0"):
            for obj in self.store.objects(kind, namespace, match):
                _line(writer, "ADDED", obj)
            since = str(self.store.version)
        version = int(since)
        wake = asyncio.Event()
        self._watches.add(wake)
        try:
            while True:
                wake.clear()
                try:
                    changes = self.store.changes_since(version, kind, namespace, match)
                except StatusError as exc:
                    _line(writer, "ERROR", exc.status())
                    break
                for change in changes:
                    _line(writer, change.type, change.obj)
                    version = change.version
                await writer.drain()
                left = deadline - loop.time()
                if left <= 0 or reader.at_eof() or writer.is_closing():
                    break
                try:
                    async with asyncio.timeout(min(left, self.bookmark_s)):
                        await wake.wait()
                except TimeoutError:
                    if bookmarks and loop.time() < deadline:
                        version = self.store.version  # nothing it watches changed since
                        _line(writer, "BOOKMARK", _bookmark(kind, version))
                        self.bookmarks += 1
        finally:
            self._watches.discard(wake)
        writer.write(b"0\r\n\r\n")
        await writer.drain()


def _watched(request: Request) -> tuple[str, str | None, Match] | None:
    """The kind, namespace (None: all) and selection a `?watch=1` request watches; None
    for any other request."""
    if request.method != "GET" or request.query.get("watch") not in ("1", "true"):
        return None
    if (m := NODES_PATH.match(request.path)) and m.group(1) is None:
        return "Node", None, everything
    if (m := EVENTS_PATH.match(request.path)) and m.group(2) is None:
        return "Event", m.group(1), everything
    if (m := SLICES_PATH.match(request.path)) and m.group(1) is None:
        return "ResourceSlice", None, _selected(request)
    return None


def _selected(request: Request) -> Match:
    """The `fieldSelector` (of ResourceSlice fields) and `labelSelector` (equality terms
    and bare keys) of a list or watch; 400 for a field the API server cannot select."""
    fields: list[tuple[tuple[str, str], str, bool]] = []
    for term in filter(None, request.query.get("fieldSelector", "").split(",")):
        key, equal, value = _term(term)
        if key not in SLICE_FIELDS or value is None:
            raise StatusError(400, "BadRequest", f'field label not supported: "{key}"')
        fields.append((SLICE_FIELDS[key], value, equal))
    labels = [_term(t) for t in filter(None, request.query.get("labelSelector", "").split(","))]

    def match(obj: Obj) -> bool:
        for (part, key), value, equal in fields:
            if (str(obj.get(part, {}).get(key) or "") == value) != equal:
                return False
        have = obj.get("metadata", {}).get("labels") or {}
        for name, equal, wanted in labels:
            if wanted is None:
                if (name in have) != equal:
                    return False
            elif (have.get(name) == wanted) != equal:
                return False
        return True

    return match


def _term(term: str) -> tuple[str, bool, str | None]:
    """`k=v`, `k==v` or `k!=v` as (k, equal, v); a bare `k` or `!k` (labels: has k, has
    no k) as (k, True or False, None)."""
    for op, equal in (("!=", False), ("==", True), ("=", True)):
        if op in term:
            key, _, value = term.partition(op)
            return key.strip(), equal, value.strip()
    return term.strip().lstrip("!"), not term.strip().startswith("!"), None


def _bookmark(kind: str, version: int) -> Obj:
    return {"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": str(version)}}


def _line(writer: asyncio.StreamWriter, type_: str, obj: Obj) -> None:
    data = json.dumps({"type": type_, "object": obj}).encode() + b"\n"
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")


async def _read_request(reader: asyncio.StreamReader) -> Request | None:
    line = await reader.readline()
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = h.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    raw = await reader.readexactly(length) if length else b""
    parts = urlsplit(target)
    return Request(
        method,
        parts.path,
        {k: v[-1] for k, v in parse_qs(parts.query).items()},
        headers.get("content-type", "").split(";")[0],
        json.loads(raw) if raw else None,
        headers.get("connection", "").lower() == "close",
        headers.get("authorization", "").removeprefix("Bearer "),
    )


def write_kubeconfig(path: Path, url: str, token: str = "t0ken") -> Path:
    """A kubeconfig at `path` for the API server at `url`, with a bearer token."""
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "lab",
        "clusters": [{"name": "lab", "cluster": {"server": url}}],
        "users": [{"name": "agent", "user": {"token": token}}],
        "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": "agent"}}],
    }
    path.write_text(yaml.safe_dump(doc))
    return path


async def _main(port: int, nodes: tuple[str, ...], mode: str) -> None:
    server = ApiServer(nodes, port)
    await server.start()
    await server.set_mode(mode)
    print(server.url, flush=True)
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--node", action="append", default=[])
    parser.add_argument("--mode", choices=(UP, REFUSE, HANG), default=UP)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(args.port, tuple(args.node) or ("node-1",), args.mode))
