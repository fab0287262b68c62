"""A small asyncio client of the Kubernetes API: JSON over HTTP/1.1, one connection per
request, bearer token or client certificate. The agent makes a handful of calls per
health change, so a library of tens of megabytes buys it nothing (docs/benchmarks.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agents.errors import AgentError

REQUEST_TIMEOUT_S = 5.0  # connect, send and read one answer
MAX_BODY = 4 << 20


class ApiError(AgentError):
    """The API server answered with an error status."""

    def __init__(self, status: int, method: str, path: str, detail: str) -> None:
        self.status = status
        super().__init__(f"{method} {path}: HTTP {status}: {detail}")


class UnreachableError(AgentError):
    """No answer from the API server: refused, reset, timed out or not HTTP."""


@dataclass(frozen=True)
class Access:
    """Where the API server is and how to show who we are."""

    server: str  # https://10.0.0.1:443
    tls: ssl.SSLContext | None = None  # None for a plain http:// server
    token: str | None = None
    token_file: Path | None = None  # read at each request: tokens are rotated in place
    source: str = ""  # "in-cluster" or the kubeconfig path, for logs


class ApiClient:
    def __init__(self, access: Access, timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        parts = urlsplit(access.server)
        self.access = access
        self._host = parts.hostname or "localhost"
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self._prefix = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        if parts.scheme == "https" and access.tls is None:
            raise AgentError(f"{access.server}: https needs a TLS context")

    async def request(
        self,
        method: str,
        path: str,
        body: object = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """One call; the answer's JSON object. Raises ApiError or UnreachableError."""
        token = await self._token()
        payload = b"" if body is None else json.dumps(body).encode()
        lines = [
            f"{method} {self._prefix}{path} HTTP/1.1",
            f"Host: {self._host}:{self._port}",
            "Accept: application/json",
            "User-Agent: node-agent",
            "Connection: close",
            f"Content-Length: {len(payload)}",
        ]
        if body is not None:
            lines.append(f"Content-Type: {content_type}")
        if token:
            lines.append(f"Authorization: Bearer {token}")
        head = ("\r\n".join(lines) + "\r\n\r\n").encode()
        try:
            async with asyncio.timeout(self._timeout_s):
                status, data = await self._exchange(head + payload)
        except (OSError, TimeoutError, EOFError, ValueError, ssl.SSLError) as exc:
            raise UnreachableError(f"{self.access.server}: {exc!r}") from exc
        answer = _json(data)
        if status >= 300:
            detail = str(answer.get("message") or data[:200].decode(errors="replace"))
            raise ApiError(status, method, path, detail)
        return answer

    async def _token(self) -> str | None:
        if self.access.token_file is None:
            return self.access.token
        path = self.access.token_file
        try:
            return (await asyncio.to_thread(path.read_text)).strip()
        except OSError as exc:
            raise UnreachableError(f"token {path}: {exc}") from exc

    async def _exchange(self, request: bytes) -> tuple[int, bytes]:
        reader, writer = await asyncio.open_connection(
            self._host,
            self._port,
            ssl=self.access.tls,
            server_hostname=self._host if self.access.tls else None,
        )
        try:
            writer.write(request)
            await writer.drain()
            return await _read_response(reader)
        finally:
            writer.close()
            # The answer is in: how the peer closes does not matter.
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    status_line = await reader.readline()
    if not status_line.startswith(b"HTTP/1."):
        raise ValueError(f"not an HTTP answer: {status_line[:40]!r}")
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        return status, await _read_chunked(reader)
    if "content-length" in headers:
        length = int(headers["content-length"])
        if length > MAX_BODY:
            raise ValueError(f"answer of {length} bytes")
        return status, await reader.readexactly(length)
    return status, await reader.read(MAX_BODY)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = bytearray()
    while True:
        size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            return bytes(body)
        if len(body) + size > MAX_BODY:
            raise ValueError("answer too large")
        body += await reader.readexactly(size)
        await reader.readexactly(2)  # the chunk's CRLF


def _json(data: bytes) -> dict[str, Any]:
    if not data.strip():
        return {}
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
