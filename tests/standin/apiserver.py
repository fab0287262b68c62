"""An API-server stand-in on a loopback port: the paths, JSON and status codes the agent
uses (Events, `nodes/{name}/status` patches), with injected errors and the two ways a
real one is unreachable: connections refused, and connections that never get an answer.

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

from tests.standin.apistore import Obj, StatusError, Store

UP, REFUSE, HANG = "up", "refuse", "hang"
NODE_PATH = re.compile(r"^/api/v1/nodes/([^/]+)(/status)?$")
EVENTS_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/events(?:/([^/]+))?$")


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    content_type: str
    code: int


class ApiServer:
    def __init__(
        self, nodes: tuple[str, ...] = ("node-1",), port: int = 0, tls: ssl.SSLContext | None = None
    ) -> None:
        self.tls = tls  # https with this context; None: plain http
        self.store = Store()
        for name in nodes:
            self.store.add_node(name)
        self.calls: list[Call] = []
        self.mode = UP
        self.port = port
        self._failures: deque[tuple[int, str | None]] = deque()
        self._server: asyncio.Server | None = None
        self._held: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        await self._close_listener()
        for writer in list(self._held):
            writer.close()

    def fail_next(self, code: int, times: int = 1, method: str | None = None) -> None:
        """Answer the next `times` calls (of `method`, if given) with `code`."""
        self._failures.extend([(code, method)] * times)

    async def set_mode(self, mode: str) -> None:
        """up: answer; refuse: nothing listens on the port; hang: accept, never answer."""
        if mode == REFUSE:
            await self._close_listener()
        elif self._server is None:
            await self.start()
        if mode != HANG:
            for writer in list(self._held):
                writer.close()
        self.mode = mode

    async def _close_listener(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await _read_request(reader)
            if request is None:
                return
            if self.mode == HANG:
                self._held.add(writer)
                await reader.read()  # until the client gives up or the mode changes
                return
            code, body = self._answer(*request)
            self.calls.append(Call(request[0], request[1], request[2], code))
            data = json.dumps(body).encode()
            head = (
                f"HTTP/1.1 {code} {'OK' if code < 300 else 'Error'}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                "Connection: close\r\n\r\n"
            )
            writer.write(head.encode() + data)
            await writer.drain()
        except (OSError, ValueError):
            pass  # a client gone midway
        finally:
            self._held.discard(writer)
            writer.close()

    def _answer(self, method: str, path: str, content_type: str, body: object) -> tuple[int, Obj]:
        try:
            self._injected(method)
            if not isinstance(body, dict) and method in ("POST", "PATCH"):
                raise StatusError(400, "BadRequest", "the body is no JSON object")
            return self._route(method, path.split("?", maxsplit=1)[0], content_type, body)
        except StatusError as exc:
            return exc.code, exc.status()

    def _injected(self, method: str) -> None:
        for i, (code, only) in enumerate(self._failures):
            if only in (None, method):
                del self._failures[i]
                raise StatusError(code, "InternalError" if code >= 500 else "Injected", "injected")

    def _route(self, method: str, path: str, content_type: str, body: object) -> tuple[int, Obj]:
        patch = body if isinstance(body, dict) else {}
        if m := NODE_PATH.match(path):
            name, status = m.group(1), m.group(2)
            if method == "GET":
                return 200, self.store.node(name)
            if method == "PATCH" and status:
                return 200, self.store.patch_node_status(name, patch, content_type)
        elif m := EVENTS_PATH.match(path):
            namespace, name = m.group(1), m.group(2)
            if method == "GET" and name is None:
                return 200, self.store.event_list(namespace)
            if method == "POST" and name is None:
                return 201, self.store.create_event(namespace, patch)
            if method == "PATCH" and name is not None:
                return 200, self.store.patch_event(namespace, name, patch, content_type)
        elif path == "/api/v1/events" and method == "GET":
            return 200, self.store.event_list(None)
        raise StatusError(404, "NotFound", f"the server could not find {method} {path}")


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, str, object] | None:
    line = await reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = h.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    raw = await reader.readexactly(length) if length else b""
    body = json.loads(raw) if raw else None
    return method, path, headers.get("content-type", "").split(";")[0], body


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
