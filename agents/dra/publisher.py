"""Keeps this node's ResourceSlices true to what the families publish: `set` records the
wanted state and returns at once; `run` lists and watches the node's slices and creates,
updates, deletes and puts back until cancelled, waiting out an API server slow or down."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from agents.cluster.client import ApiClient, ApiError, GoneError, UnreachableError, WatchEvent
from agents.core.health import Cause
from agents.dra.slices import MULTIPLE, SLICES_PATH, build_slices, same_spec
from agents.kernel.facts import FamilyFacts
from agents.tasks import first, off_loop

log = structlog.get_logger(__name__)

FIRST_RETRY_S = 0.5
MAX_RETRY_S = 10.0
WATCH_TIMEOUT_S = 300  # a watch is opened again this often at rest
REFUSED_FOR_GOOD = (400, 422)  # the slice itself is wrong: sending it again cannot help
# Changed or gone since it was listed (409 Conflict or AlreadyExists, 404): list again.
STALE = (404, 409)

Obj = dict[str, Any]


class _StaleError(Exception):
    """What this publisher knows of the slices is behind the API server's: list again."""


class SlicePublisher:
    """One per agent, for all its drivers. The caller owns (and closes) `client`."""

    def __init__(
        self,
        node: str,
        client: ApiClient,
        *,
        device_taints: bool = False,
        evict_unhealthy: bool = False,
        first_retry_s: float = FIRST_RETRY_S,
        max_retry_s: float = MAX_RETRY_S,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
        shares_noted: Callable[[str, str | None], None] | None = None,
    ) -> None:
        """`shares_noted(driver, reason)`, blocking, is told once per driver, as its first
        slice is written, why its devices cannot be shared (None: they can, or none is
        offered)."""
        self.node = node
        self._client = client
        self._taints = device_taints
        self._evict = evict_unhealthy  # an Unhealthy device's taint is NoExecute
        self._first_retry_s, self._max_retry_s = first_retry_s, max_retry_s
        self._watch_timeout_s = watch_timeout_s
        self._wanted: dict[str, tuple[FamilyFacts, dict[str, Cause]]] = {}
        self._refused: dict[str, tuple[FamilyFacts, dict[str, Cause]]] = {}
        self._observed: dict[str, Obj] = {}  # this node's slices, as last listed or watched
        self._written: dict[str, tuple[str, Obj]] = {}  # name: (resourceVersion, spec) we wrote
        self._node_uid = ""
        self._wake = asyncio.Event()
        self._parked = False  # the reconcile loop waits for a wake-up
        self._delay = first_retry_s
        self.reachable: bool | None = None  # None until the first list ends
        self._unshared_said = False  # the API server dropped multiple allocations: said
        self._shares_noted = shares_noted
        self._noted: set[str] = set()  # drivers whose shares were noted

    def set(self, devices: FamilyFacts, causes: Mapping[str, Cause]) -> None:
        """Publish `devices` of their driver with their grades; `causes`: why each that is
        not Healthy is so (by name): an Unhealthy one is left out or tainted, a Degraded
        one tainted. Never waits: the API calls happen in `run`."""
        self._wanted[devices.driver] = (devices, dict(causes))
        self._wake.set()

    @property
    def settled(self) -> bool:
        """Whether every `set` and every change watched so far has been reconciled: the
        publisher waits with nothing to do."""
        return self._parked and not self._wake.is_set()

    async def run(self) -> None:
        """Publish until cancelled."""
        log.info("resource_slices_publishing", node=self.node, api=self._client.access.server)
        while True:
            try:
                if not self._node_uid:
                    node = await self._client.request("GET", f"/api/v1/nodes/{self.node}")
                    self._node_uid = str(node.get("metadata", {}).get("uid") or "")
                await self._session()
            except GoneError:
                continue  # the watch fell behind what the server keeps: list again
            except _StaleError:
                await asyncio.sleep(self._first_retry_s)  # someone else writes too
                continue
            except (ApiError, UnreachableError) as exc:
                self._failed(exc)
            await asyncio.sleep(self._delay)
            self._delay = min(self._delay * 2, self._max_retry_s)

    def _failed(self, exc: Exception) -> None:
        if self.reachable is not False:  # one line per outage, not per retry
            log.warning(
                "resource_slices_unpublished",
                api=self._client.access.server,
                error=str(exc),
                effect="retrying with backoff; prepared claims and RPCs are unaffected",
            )
        self.reachable = False

    async def _session(self) -> None:
        """List this node's slices, then follow them and the wanted state until an error."""
        selector = {"fieldSelector": f"spec.nodeName={self.node}"}
        listing = await self._client.list(
            f"{SLICES_PATH}?fieldSelector=spec.nodeName%3D{self.node}"
        )
        self._observed = {str(s["metadata"]["name"]): s for s in listing.items}
        if self.reachable is False:
            log.info("resource_slices_reachable", api=self._client.access.server)
        self.reachable, self._delay = True, self._first_retry_s
        self._wake.set()
        await first(self._follow(listing.resource_version, selector), self._reconcile_forever())

    async def _follow(self, version: str, selector: dict[str, str]) -> None:
        """Keep `_observed` current from the watch, opened again when the server ends it."""
        while True:
            events = self._client.watch(SLICES_PATH, version, self._watch_timeout_s, selector)
            async with contextlib.aclosing(events):
                async for event in events:
                    version = event.resource_version or version
                    if event.type != "BOOKMARK":
                        self._seen(event)

    def _seen(self, event: WatchEvent) -> None:
        name = str(event.object.get("metadata", {}).get("name") or "")
        if event.type == "DELETED":
            self._observed.pop(name, None)
        else:
            known = self._observed.get(name)
            if known is not None and _newer(known, event.object):
                return  # a write of ours answered before the watch caught up
            self._observed[name] = event.object
        self._wake.set()

    async def _reconcile_forever(self) -> None:
        while True:
            self._wake.clear()
            for driver in list(self._wanted):
                await self._reconcile(driver)
            self._parked = True
            try:
                await self._wake.wait()
            finally:
                self._parked = False

    async def _reconcile(self, driver: str) -> None:
        wanted = self._wanted[driver]
        if self._refused.get(driver) is wanted:
            return  # refused as it is: only a new `set` can help
        try:
            await self._sync(driver, *wanted)
        except ApiError as exc:
            if exc.status in STALE:
                raise _StaleError from exc
            if exc.status not in REFUSED_FOR_GOOD:
                raise
            log.error("resource_slice_refused", driver=driver, error=str(exc))
            self._refused[driver] = wanted

    async def _sync(self, driver: str, devices: FamilyFacts, unhealthy: dict[str, Cause]) -> None:
        """Make the driver's slices what they should be: the pool's generation goes up
        when a stored slice changes or goes, so the scheduler never mixes old and new."""
        ours = {
            n: s for n, s in self._observed.items() if s.get("spec", {}).get("driver") == driver
        }
        generation = max((_generation(s) for s in ours.values()), default=0)
        want = self._build(devices, unhealthy, generation)
        if any(n not in want or not self._current(n, s, want[n]) for n, s in ours.items()):
            generation += 1
            want = self._build(devices, unhealthy, generation)
        for name, body in want.items():
            have = ours.get(name)
            if have is None:
                await self._write("POST", SLICES_PATH, body)
            elif not self._current(name, have, body):
                body["metadata"]["resourceVersion"] = have["metadata"].get("resourceVersion")
                await self._write("PUT", f"{SLICES_PATH}/{name}", body)
        for name in ours.keys() - want.keys():
            await self._client.request("DELETE", f"{SLICES_PATH}/{name}")
            self._observed.pop(name, None)
            log.info("resource_slice_deleted", name=name, driver=driver)

    def _build(
        self, devices: FamilyFacts, unhealthy: dict[str, Cause], generation: int
    ) -> dict[str, Obj]:
        slices = build_slices(
            self.node,
            self._node_uid,
            devices,
            unhealthy,
            taints=self._taints,
            generation=generation,
            evict=self._evict,
        )
        return {s["metadata"]["name"]: s for s in slices}

    def _current(self, name: str, have: Obj, want: Obj) -> bool:
        """Whether a stored slice says what `want` does: the same spec, or the very
        version written from that spec (an API server may drop what it does not know)."""
        version = str(have.get("metadata", {}).get("resourceVersion") or "")
        return self._written.get(name) == (version, want["spec"]) or same_spec(have, want)

    def _say_unshared(self, body: Obj, stored: Obj) -> str | None:
        """Why devices sent to be allocated several times at once cannot be: the API
        server stored them without that (resource.k8s.io's DRAConsumableCapacity off
        before 1.36), logged once; None where it kept them, or none was sent so."""
        sent = {d["name"] for d in body["spec"]["devices"] if d.get(MULTIPLE)}
        kept = {
            d.get("name") for d in stored.get("spec", {}).get("devices") or [] if d.get(MULTIPLE)
        }
        if not sent - kept:
            return None
        reason = f"the API server dropped {MULTIPLE} (DRAConsumableCapacity off)"
        if not self._unshared_said:
            self._unshared_said = True
            log.warning(
                "dra_shares_unavailable",
                driver=body["spec"]["driver"],
                reason=reason,
                effect="each device is allocated to one claim at a time",
            )
        return reason

    async def _note_shares(self, driver: str, reason: str | None) -> None:
        """Once per driver: tell `shares_noted` (off the event loop: it writes a file)."""
        noted = self._shares_noted
        if noted is None or driver in self._noted:
            return
        self._noted.add(driver)
        await off_loop(lambda: noted(driver, reason), "dra-shares-note")

    async def _write(self, method: str, path: str, body: Obj) -> None:
        stored = await self._client.request(method, path, body)
        meta = stored.get("metadata", {})
        name = str(meta.get("name") or body["metadata"]["name"])
        self._observed[name] = stored
        self._written[name] = (str(meta.get("resourceVersion") or ""), body["spec"])
        await self._note_shares(body["spec"]["driver"], self._say_unshared(body, stored))
        pool = body["spec"]["pool"]
        log.info(
            "resource_slice_written",
            name=name,
            driver=body["spec"]["driver"],
            devices=len(body["spec"]["devices"]),
            generation=pool["generation"],
            created=method == "POST",
        )


def _generation(slice_: Obj) -> int:
    value = slice_.get("spec", {}).get("pool", {}).get("generation")
    return value if isinstance(value, int) else 0


def _newer(known: Obj, seen: Obj) -> bool:
    """Whether `known` is a later version of the object than `seen` (resourceVersions
    of one object grow; one that is no number is never taken for older)."""
    a = str(known.get("metadata", {}).get("resourceVersion") or "")
    b = str(seen.get("metadata", {}).get("resourceVersion") or "")
    return a.isdigit() and b.isdigit() and int(a) > int(b)
