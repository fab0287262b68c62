"""A third kubelet API, defined outside agents/ to show that one needs nothing of it
beyond the `Api` interface (agents/kernel/runtime.py): `--api listing` serves every
family's devices, their health and their edits over one unix-socket gRPC service of two
JSON methods, on a socket made by agents/kernel/socket_server.py.

- `/listing.Listing/Watch` (unary-stream): the whole listing at once, then again on
  every change of any device list or of the families served;
- `/listing.Listing/Edits` (unary): `{"devices": [[resource, id], ...]}` -> what one
  container gets for them, from the family that serves them."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from agents.core.health import DeviceHealth
from agents.errors import ConfigError
from agents.kernel.edits import ContainerEdits
from agents.kernel.handover import Holdings
from agents.kernel.offer import Offer
from agents.kernel.runtime import Host, Runtime, Serve
from agents.kernel.socket_server import UnixServer, keep_serving
from agents.kernel.versioned import Versioned
from agents.tasks import first

SERVICE = "listing.Listing"
WATCH = f"/{SERVICE}/Watch"
EDITS = f"/{SERVICE}/Edits"
Doc = dict[str, Any]


def encode(doc: Doc) -> bytes:
    return json.dumps(doc, sort_keys=True).encode()


def decode(data: bytes) -> Doc:
    doc: Doc = json.loads(data)
    return doc


def health_doc(state: DeviceHealth) -> Doc:
    cause = state.cause
    return {
        "grade": state.grade.value,
        "where": state.where,
        "cause": None if cause is None else cause.label,
        "text": None if cause is None else cause.text(),
        "figures": {} if cause is None else dict(cause.figures()),
    }


def listing(offers: Sequence[Offer]) -> Doc:
    """Every family's devices as the kubelet-side client sees them."""
    families = []
    for offer in offers:
        health = {(s.resource, s.device_id): s for s in offer.device_health()}
        devices = [
            {"resource": r.name, "id": d.id, "numa": d.numa, "healthy": d.healthy}
            | (health_doc(health[r.name, d.id]) if (r.name, d.id) in health else {})
            for r in offer.resources()
            for d in r.inventory.devices
        ]
        families.append({"name": offer.name, "devices": devices})
    return {"families": families}


def edits_doc(edits: ContainerEdits) -> Doc:
    return {
        "env": edits.named_env(),
        "nodes": {
            f"{r}/{i}": [[s.container_path, s.host_path, s.permissions] for s in nodes]
            for (r, i), nodes in edits.device_nodes.items()
        },
        "mounts": [[m.container_path, m.host_path, m.read_only] for m in edits.mounts],
    }


class ListingRuntime:
    """Serves the listing on one socket, served again if someone deletes it."""

    name = "listing"

    def __init__(self, path: Path, host: Host) -> None:
        self._host = host
        self._replaced = Versioned()
        self._server = UnixServer(path, self._add)

    def _add(self, server: grpc.aio.Server) -> None:
        handlers = {
            "Watch": grpc.unary_stream_rpc_method_handler(
                self._watch, request_deserializer=decode, response_serializer=encode
            ),
            "Edits": grpc.unary_unary_rpc_method_handler(
                self._edits, request_deserializer=decode, response_serializer=encode
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))

    async def _watch(self, request: Doc, context: grpc.aio.ServicerContext) -> AsyncIterator[Doc]:
        while True:
            offers = self._host.families()
            marks = [(r.inventory, r.inventory.version) for o in offers for r in o.resources()]
            replaced = self._replaced.version
            yield listing(offers)
            waits = [inventory.wait_newer(version) for inventory, version in marks]
            await first(self._replaced.wait_newer(replaced), *waits)

    async def _edits(self, request: Doc, context: grpc.aio.ServicerContext) -> Doc:
        keys = [(str(r), str(i)) for r, i in request["devices"]]
        for offer in self._host.families():
            if {r.name for r in offer.resources()} >= {r for r, _ in keys}:
                return edits_doc(offer.edits(keys))
        await context.abort(grpc.StatusCode.NOT_FOUND, "no family serves all these devices")
        raise AssertionError("abort returns no answer")

    def check(self, offers: Sequence[Offer]) -> None:
        names = [r.name for o in offers for r in o.resources()]
        if len(names) != len(set(names)):
            raise ConfigError("--api listing", ",".join(names), "resources of distinct names")

    async def replace(self, offers: Sequence[Offer], unchanged: Collection[str]) -> None:
        self._replaced.bump()

    def serving(self) -> bool:
        return self._server.serving

    def sockets(self) -> Sequence[UnixServer]:
        return [self._server]

    async def restart(self) -> None:
        await self._server.stop()
        await self._server.start()

    async def run(self) -> None:
        await self._server.start()
        try:
            await keep_serving(lambda: [self], event="listing_socket_gone")
        finally:
            await self._server.stop()


class ListingServe:
    names_devices = False

    def __init__(self, path: Path) -> None:
        self._path = path

    def pairing(self) -> None:
        """Nobody asks for a preferred allocation: nothing to pair."""
        return None

    def runtime(self, fresh: Sequence[Offer], host: Host) -> Runtime:
        return ListingRuntime(self._path, host)


class NothingHeld:
    """A listing client holds no devices: nothing is left over for another API."""

    version = 0

    def holds(self, resource: str, device_id: str) -> bool:
        return False

    async def wait_newer(self, version: int) -> None:
        await asyncio.Event().wait()

    async def load(self, offers: Sequence[Offer]) -> None:
        """Nothing to read."""

    async def run(self) -> None:
        """Nothing to keep current."""


class ListingApi:
    name = "listing"

    def add_flags(self, run: argparse.ArgumentParser) -> None:
        run.add_argument(
            "--listing-socket", type=Path, metavar="PATH", help="listing: the socket served"
        )

    def flags_error(self, opts: argparse.Namespace) -> str | None:
        return None

    async def serve(self, opts: argparse.Namespace, env: Mapping[str, str]) -> Serve:
        if opts.listing_socket is None:
            raise ConfigError("--api listing", "--listing-socket", "the socket to serve on")
        return ListingServe(opts.listing_socket)

    def leftovers(self, opts: argparse.Namespace) -> Holdings:
        return NothingHeld()
