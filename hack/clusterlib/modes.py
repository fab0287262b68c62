"""One workload through the real scheduler in one mode: DRA claims whose pairs match on the
PCIe switch, or on the root complex only, or the device plugins' counts with the devices
then chosen on the node by the agent's ledger. After every operation the cluster is let
settle, and every pod left Unschedulable is checked against every node's free devices."""

from __future__ import annotations

import itertools
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from hack.clusterlib.accounting import (
    COUNTS,
    Cluster,
    allocation_of,
    claim_paired,
    devices_paired,
    fits,
)
from hack.clusterlib.api import Api
from hack.clusterlib.layouts import Place
from hack.clusterlib.replay import NodeReplay
from hack.clusterlib.state import State
from hack.clusterlib.workload import Create, Shape, Workload, pod

GRACE_S = 10.0  # the scheduler's longest pod backoff: a wait past it is no retry timing


@dataclass
class Outcome:
    """What one mode made of the workload."""

    mode: str
    operations: int = 0
    created: Counter[str] = field(default_factory=Counter)
    deleted: int = 0
    pair_pods: int = 0  # asked for pairs and got devices
    paired: int = 0  # of those, every pair under one PCIe switch
    gpu_pods: int = 0
    misses: list[str] = field(default_factory=list)
    ever_unschedulable: set[str] = field(default_factory=set)
    pending_while_free: set[str] = field(default_factory=set)  # past GRACE_S
    free_waits: list[float] = field(default_factory=list)  # Unschedulable while it fit
    latencies: list[float] = field(default_factory=list)  # creation to allocation
    first_try: list[float] = field(default_factory=list)  # of pods never Unschedulable
    # Device plugins: pair pods whose node had the pairs free when the devices were chosen.
    pairable_on_node: int = 0
    paired_on_node: int = 0
    unsettled: int = 0  # operations after which the cluster had not settled in GRACE_S
    wall_s: float = 0.0

    def summary(self) -> dict[str, object]:
        """For JSON: counts and lists, latencies in ms."""
        return {
            "mode": self.mode,
            "operations": self.operations,
            "created": dict(sorted(self.created.items())),
            "deleted": self.deleted,
            "pair_pods": self.pair_pods,
            "paired": self.paired,
            "gpu_pods": self.gpu_pods,
            "misses": self.misses,
            "ever_unschedulable": len(self.ever_unschedulable),
            "pending_while_free": sorted(self.pending_while_free),
            "free_waits_s": [round(w, 3) for w in self.free_waits],
            "latencies_ms": [round(1000 * x, 1) for x in self.latencies],
            "first_try_ms": [round(1000 * x, 1) for x in self.first_try],
            "pairable_on_node": self.pairable_on_node,
            "paired_on_node": self.paired_on_node,
            "unsettled": self.unsettled,
            "wall_s": round(self.wall_s, 2),
        }


@dataclass
class Live:
    name: str
    shape: Shape
    uid: str
    created: float


class ModeRun:
    """The workload in one mode: `grouping` is "switch" or "root" (DRA claims from the
    templates named `<shape>-<grouping>`) or COUNTS (the device plugins' limits)."""

    def __init__(
        self, api: Api, state: State, cluster: Cluster, namespace: str, grouping: str
    ) -> None:
        self.api, self.state, self.cluster = api, state, cluster
        self.namespace, self.grouping = namespace, grouping
        self.out = Outcome(grouping)
        self.live: list[Live] = []
        self.judged: set[str] = set()
        self.fit_since: dict[str, float] = {}
        self.replays: dict[str, NodeReplay] = {}
        self.pairable: set[str] = set()  # replayed pods whose node had their pairs free
        self._names = itertools.count()

    @property
    def dra(self) -> bool:
        return self.grouping != COUNTS

    async def run(self, seed: int, operations: int) -> Outcome:
        start = time.monotonic()
        self.replays = {node: NodeReplay(lay, seed) for node, lay in self.cluster.layouts.items()}
        workload = Workload(seed, self.cluster.total_gpus())
        for _ in range(operations):
            op = workload.next()
            if isinstance(op, Create):
                await self._create(op.shape)
            else:
                await self._delete(self.live.pop(op.index))
            self.out.operations += 1
            if not await self.state.wait(self._settled, GRACE_S):
                self._past_grace()
            self._judge()
        self.out.wall_s = time.monotonic() - start
        await self.drain()
        return self.out

    async def _create(self, shape: Shape) -> None:
        name = f"{shape.name}-{next(self._names)}"
        template = f"{shape.name}-{self.grouping}" if self.dra else None
        created = time.monotonic()
        obj = await self.api.client.request(
            "POST", f"/api/v1/namespaces/{self.namespace}/pods", pod(name, shape, template)
        )
        self.live.append(Live(name, shape, obj["metadata"]["uid"], created))
        self.out.created[shape.name] += 1

    async def _delete(self, live: Live) -> None:
        node = self._node(live)
        await self.api.delete("Pod", live.name, self.namespace)
        if node is not None and not self.dra:
            self.replays[node].release(live.name)
        self.out.deleted += 1

    async def drain(self) -> None:
        """Delete every pod left; wait until their claims are gone."""
        for live in self.live:
            await self.api.delete("Pod", live.name, self.namespace)
        self.live = []
        await self.state.wait(lambda: not self.state.claims.items and not self.state.pods.items, 60)

    # Settling

    def _node(self, live: Live) -> str | None:
        obj = self.state.pods.items.get(live.name)
        return obj["spec"].get("nodeName") if obj else None

    def _unschedulable(self, live: Live) -> bool:
        obj = self.state.pods.items.get(live.name)
        conditions = (obj or {}).get("status", {}).get("conditions") or []
        return any(
            c["type"] == "PodScheduled"
            and c["status"] == "False"
            and c.get("reason") == "Unschedulable"
            for c in conditions
        )

    def _allocated(self, live: Live) -> bool:
        if not self.dra:
            return True
        claims = self.state.claims_of(live.uid)
        return bool(claims) and all((c.get("status") or {}).get("allocation") for c in claims)

    def used(self) -> dict[str, set[Place]]:
        """Node -> devices in use: allocated claims (pods deleted or not), or the replays'."""
        used: dict[str, set[Place]] = {}
        if self.dra:
            for claim in self.state.claims.items.values():
                got = allocation_of(claim, self.cluster)
                if got is not None:
                    used.setdefault(got.node, set()).update(got.devices.values())
            return used
        for node, replay in self.replays.items():
            for held in replay.held.values():
                ids = [i for kind in held.values() for i in kind]
                used[node] = used.get(node, set()) | {
                    self.cluster.place_by_id(node, i) for i in ids
                }
        return used

    def _settled(self) -> bool:
        uids = {live.uid for live in self.live}
        orphans = [
            c
            for c in self.state.claims.items.values()
            if not any(o["uid"] in uids for o in c["metadata"].get("ownerReferences") or [])
        ]
        waiting = False
        for live in self.live:
            placed = self._node(live) is not None
            if placed and not self.dra:
                self._admit(live)
            if not ((placed and self._allocated(live)) or self._unschedulable(live)):
                waiting = True
        return not waiting and not orphans and not self._fitting()

    def _fitting(self) -> list[Live]:
        """Pods left Unschedulable while some node's free devices meet their request; how
        long each has been so is tracked across calls."""
        used, now = self.used(), time.monotonic()
        fitting = []
        for live in self.live:
            if self._unschedulable(live) and self._node(live) is None:
                self.out.ever_unschedulable.add(live.name)
                if self.cluster.fits_somewhere(live.shape, used, self.grouping) is not None:
                    fitting.append(live)
                    self.fit_since.setdefault(live.name, now)
                    continue
            since = self.fit_since.pop(live.name, None)
            if since is not None:
                self.out.free_waits.append(now - since)
        return fitting

    def _past_grace(self) -> None:
        fitting = self._fitting()
        for live in fitting:
            self.out.pending_while_free.add(live.name)
        if not fitting:
            self.out.unsettled += 1

    # Judging

    def _admit(self, live: Live) -> None:
        """The device plugins' choice on the node the scheduler bound the pod to."""
        node = self._node(live)
        if node is None or live.name in self.replays[node].held:
            return
        free = self.cluster.free(self.used())[node]
        if live.shape.paired and fits(live.shape, free, "switch"):
            self.pairable.add(live.name)
        self.replays[node].admit(live.name, live.shape)

    def _judge(self) -> None:
        for live in self.live:
            if live.name in self.judged or self._node(live) is None or not self._allocated(live):
                continue
            self.judged.add(live.name)
            done = (
                self.state.allocated_at.get(live.uid)
                if self.dra
                else self.state.bound_at.get(live.uid)
            )
            if done is not None:
                self.out.latencies.append(done - live.created)
                if live.name not in self.out.ever_unschedulable:
                    self.out.first_try.append(done - live.created)
            if not live.shape.paired:
                self.out.gpu_pods += 1
                continue
            self.out.pair_pods += 1
            ok, detail = self._paired(live)
            self.out.paired += ok
            if live.name in self.pairable:
                self.out.pairable_on_node += 1
                self.out.paired_on_node += ok
            if not ok:
                self.out.misses.append(f"{live.name} on {self._node(live)}: {detail}")

    def _paired(self, live: Live) -> tuple[bool, Any]:
        node = self._node(live)
        assert node is not None
        if not self.dra:
            held = self.replays[node].held[live.name]
            places = {
                k: [self.cluster.place_by_id(node, i) for i in ids] for k, ids in held.items()
            }
            return devices_paired(places["gpu"], places["nic"]), held
        claim = self.state.claims_of(live.uid)[0]
        got = allocation_of(claim, self.cluster)
        assert got is not None
        detail = {r: (p.dra_name, p.switch) for r, p in got.devices.items()}
        if got.node != node:
            return False, f"claim allocated on {got.node}, pod bound to {node}"
        return claim_paired(got), detail
