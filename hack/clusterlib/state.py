"""What the API server says of our pods and claims, kept by list-and-watch, with the time
each pod was seen bound and each claim seen allocated; `changed` wakes those waiting."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

from agents.cluster.client import GoneError, UnreachableError
from hack.clusterlib.api import Api, path_of


class Watched:
    """One collection, listed then watched until cancelled."""

    def __init__(self, api: Api, path: str, changed: Callable[[str, dict[str, Any]], None]):
        self.api, self.path, self._changed = api, path, changed
        self.items: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()

    async def run(self) -> None:
        while True:
            listing = await self.api.client.list(self.path)
            self.items = {i["metadata"]["name"]: i for i in listing.items}
            for item in listing.items:
                self._changed("ADDED", item)
            self.synced.set()
            version = listing.resource_version
            while True:
                try:
                    async with contextlib.aclosing(
                        self.api.client.watch(self.path, version, timeout_s=600)
                    ) as events:
                        async for event in events:
                            version = event.resource_version or version
                            if event.type == "BOOKMARK":
                                continue
                            name = event.object["metadata"]["name"]
                            if event.type == "DELETED":
                                self.items.pop(name, None)
                            else:
                                self.items[name] = event.object
                            self._changed(event.type, event.object)
                except GoneError:
                    break
                except UnreachableError:
                    await asyncio.sleep(0.2)


class State:
    """Pods and claims of one namespace, and when each pod was bound and its claim
    allocated (monotonic seconds, as this tool saw them)."""

    def __init__(self, api: Api, namespace: str) -> None:
        self.changed = asyncio.Condition()
        self.pods = Watched(api, path_of("Pod", namespace), self._pod)
        self.claims = Watched(
            api, "/apis/resource.k8s.io/v1/namespaces/" + namespace + "/resourceclaims", self._claim
        )
        self.bound_at: dict[str, float] = {}  # pod UID ->
        self.allocated_at: dict[str, float] = {}  # pod UID -> its claim's allocation
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self._tasks = [asyncio.create_task(w.run()) for w in (self.pods, self.claims)]
        await asyncio.wait_for(
            asyncio.gather(self.pods.synced.wait(), self.claims.synced.wait()), 30
        )

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _pod(self, _: str, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        if pod["spec"].get("nodeName") and uid not in self.bound_at:
            self.bound_at[uid] = time.monotonic()
        self._notify()

    def _claim(self, _: str, claim: dict[str, Any]) -> None:
        if (claim.get("status") or {}).get("allocation"):
            for owner in claim["metadata"].get("ownerReferences") or []:
                self.allocated_at.setdefault(owner["uid"], time.monotonic())
        self._notify()

    def _notify(self) -> None:
        async def wake() -> None:
            async with self.changed:
                self.changed.notify_all()

        asyncio.get_running_loop().create_task(wake())

    def claims_of(self, pod_uid: str) -> list[dict[str, Any]]:
        return [
            c
            for c in self.claims.items.values()
            if any(o["uid"] == pod_uid for o in c["metadata"].get("ownerReferences") or [])
        ]

    async def wait(self, done: Callable[[], bool], within: float) -> bool:
        """Until `done()` after some change, or `within` seconds; whether it is done."""
        try:
            async with asyncio.timeout(within), self.changed:
                await self.changed.wait_for(done)
            return True
        except TimeoutError:
            return done()
