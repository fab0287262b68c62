"""hack/scheduler_cost on a cluster: N kubelet-less Nodes, each with a copy of the agent's
GPU slice (without, then with sharing.shares), and the time from a pod's creation to its
binding by the cluster's own scheduler, for a share claim and a whole-GPU claim, with the
GPUs free and with most of them taken by claims the scheduler placed first."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from agents.cluster.access import from_kubeconfig
from agents.cluster.client import ApiClient, ApiError, GoneError, UnreachableError
from hack.schedcostlib.objects import (
    KINDS,
    LABEL,
    claim,
    fill_count,
    node_name,
    node_object,
    node_slice,
    pod,
    shared,
    summary,
)

NODES = "/api/v1/nodes"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
MINE = {"labelSelector": f"{LABEL}=true"}
NOW = {"gracePeriodSeconds": 0, "propagationPolicy": "Background"}
BOUND_WAIT_S = 120.0
Progress = Callable[[str], None]


class Cluster:
    """The admin's client, and our namespace's paths."""

    def __init__(self, kubeconfig: Path, namespace: str, concurrency: int) -> None:
        self.api = ApiClient(from_kubeconfig(kubeconfig), timeout_s=60.0)
        self.ns = namespace
        self.pods = f"/api/v1/namespaces/{namespace}/pods"
        self.claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
        self._gate = asyncio.Semaphore(concurrency)

    async def post(self, path: str, obj: dict[str, Any]) -> dict[str, Any]:
        async with self._gate:
            return await self.api.request("POST", path, obj)

    async def delete(self, path: str) -> None:
        async with self._gate:
            with contextlib.suppress(ApiError):  # gone already
                await self.api.request("DELETE", path, NOW)

    async def names(self, path: str, selector: str = f"{LABEL}=true") -> list[str]:
        listing = await self.api.list(f"{path}?labelSelector={selector}")
        return [i["metadata"]["name"] for i in listing.items]

    async def delete_all(self, path: str, selector: str = f"{LABEL}=true") -> None:
        names = await self.names(path, selector)
        await asyncio.gather(*(self.delete(f"{path}/{n}") for n in names))

    async def until_none(self, path: str, deadline_s: float, selector: str = "") -> None:
        deadline = time.monotonic() + deadline_s
        while await self.names(path, selector or f"{LABEL}=true"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path}: ours still there after {deadline_s:.0f} s")
            await asyncio.sleep(0.5)


class Bound:
    """When each of our pods was first seen bound, from one watch of the namespace."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.at: dict[str, float] = {}
        self._changed = asyncio.Condition()

    async def run(self) -> None:
        api, path = self.cluster.api, self.cluster.pods
        while True:
            listing = await api.list(f"{path}?labelSelector={LABEL}=true")
            await self._see(listing.items)
            version = listing.resource_version
            with contextlib.suppress(GoneError, UnreachableError):
                while True:
                    async for event in api.watch(path, version, 300, MINE):
                        version = event.resource_version or version
                        await self._see([event.object])

    async def _see(self, pods: Iterable[dict[str, Any]]) -> None:
        now = time.monotonic()
        fresh = False
        for p in pods:
            name = p.get("metadata", {}).get("name")
            if name and (p.get("spec") or {}).get("nodeName") and name not in self.at:
                self.at[name] = now
                fresh = True
        if fresh:
            async with self._changed:
                self._changed.notify_all()

    async def wait(self, names: Iterable[str], timeout_s: float = BOUND_WAIT_S) -> float:
        """The latest of their binding times, once all are bound."""
        wanted = list(names)
        try:
            async with asyncio.timeout(timeout_s), self._changed:
                await self._changed.wait_for(lambda: all(n in self.at for n in wanted))
        except TimeoutError:
            late = [n for n in wanted if n not in self.at]
            raise TimeoutError(
                f"{len(late)} pods not bound after {timeout_s:.0f} s: {late[:3]}"
            ) from None
        return max(self.at[n] for n in wanted)


async def clean(c: Cluster, progress: Progress) -> None:
    """Everything of ours: pods at once, claims (their deallocation awaited), slices, nodes."""
    with contextlib.suppress(ApiError):
        await c.delete_all(c.pods)
        await c.delete_all(c.claims)
        await c.until_none(c.claims, 300)
    await c.delete_all(SLICES)
    await c.delete_all(NODES)
    await c.until_none(NODES, 300)
    progress("clean: none of ours left")


async def namespace(c: Cluster) -> None:
    """Ours, Active: one a run before deletes may still be terminating."""
    deadline = time.monotonic() + 300
    while True:
        try:
            await c.post("/api/v1/namespaces", {"metadata": {"name": c.ns}})
        except ApiError as exc:
            if exc.status != 409:
                raise
        got = await c.api.request("GET", f"/api/v1/namespaces/{c.ns}")
        if (got.get("status") or {}).get("phase") == "Active":
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"namespace {c.ns} still terminating after 300 s")
        await asyncio.sleep(1)


async def make_nodes(c: Cluster, count: int, settle_s: float, progress: Progress) -> float:
    """Create the Nodes, then let the node controller see them for `settle_s` (past its
    grace period) before anything is measured. Seconds taken."""
    start = time.monotonic()
    await asyncio.gather(*(c.post(NODES, node_object(node_name(i))) for i in range(count)))
    progress(
        f"{count} nodes created in {time.monotonic() - start:.1f} s; settling {settle_s:.0f} s"
    )
    await asyncio.sleep(max(0.0, settle_s - (time.monotonic() - start)))
    return time.monotonic() - start


async def node_writes(c: Cluster) -> dict[str, int]:
    """What the node controller changed on our nodes: NoExecute taints, Ready not Unknown."""
    listing = await c.api.list(f"{NODES}?labelSelector={LABEL}=true")
    out = {"nodes": len(listing.items), "noexecute_tainted": 0, "ready_not_unknown": 0}
    for n in listing.items:
        taints = (n.get("spec") or {}).get("taints") or []
        out["noexecute_tainted"] += any(t.get("effect") == "NoExecute" for t in taints)
        ready = [
            x for x in (n.get("status") or {}).get("conditions") or [] if x.get("type") == "Ready"
        ]
        out["ready_not_unknown"] += any(x.get("status") != "Unknown" for x in ready)
    return out


async def sample(c: Cluster, bound: Bound, name: str, kind: str) -> float:
    """Milliseconds from the pod's creation (its claim made just before) to its binding."""
    await c.post(c.claims, claim(name, kind))
    start = time.monotonic()
    await c.post(c.pods, pod(name, name, "sample"))
    bound_at = await bound.wait([name])
    got = await c.api.request("GET", f"{c.claims}/{name}")
    if not (got.get("status") or {}).get("allocation"):
        raise RuntimeError(f"claim {name}: pod bound but claim not allocated")
    return (bound_at - start) * 1000


async def samples(
    c: Cluster, bound: Bound, prefix: str, count: int, kinds: tuple[str, ...]
) -> dict[str, list[float]]:
    """One warm-up of each kind (not counted), then `count` of each, alternating."""
    out: dict[str, list[float]] = {k: [] for k in kinds}
    for kind in kinds:
        await sample(c, bound, f"{prefix}-{kind}-warm", kind)
    for i in range(count):
        for kind in kinds:
            out[kind].append(await sample(c, bound, f"{prefix}-{kind}-{i}", kind))
    return out


async def fill(c: Cluster, bound: Bound, nodes: int, gpus: int) -> float:
    """`nodes` pods, each with one claim of `gpus` whole GPUs: whole nodes full. Seconds."""
    names = [f"fill-{i:04d}" for i in range(nodes)]
    start = time.monotonic()

    async def one(name: str) -> None:
        await c.post(c.claims, claim(name, "whole", gpus))
        await c.post(c.pods, pod(name, name, "fill"))

    await asyncio.gather(*(one(n) for n in names))
    await bound.wait(names, timeout_s=1800)
    return time.monotonic() - start


async def remove_samples(c: Cluster) -> None:
    await c.delete_all(c.pods, f"{LABEL}=true,role=sample")
    names = set(await c.names(c.claims))
    fills = {n for n in names if n.startswith("fill-")}
    await asyncio.gather(*(c.delete(f"{c.claims}/{n}") for n in names - fills))
    deadline = time.monotonic() + 300
    while set(await c.names(c.claims)) - fills:
        if time.monotonic() > deadline:
            raise TimeoutError("sample claims still there after 300 s")
        await asyncio.sleep(0.5)


async def variant(
    c: Cluster,
    bound: Bound,
    label: str,
    template: dict[str, Any],
    *,
    opts: Any,
    progress: Progress,
) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One kind of slices: published on every node, sampled free, filled, sampled full."""
    gpus = len(template["devices"])
    # A share names compute, which a GPU not published for shares has not: it never fits.
    kinds = KINDS if shared(template) else ("whole",)
    filled = fill_count(opts.nodes, opts.full)
    start = time.monotonic()
    await asyncio.gather(
        *(c.post(SLICES, node_slice(template, node_name(i))) for i in range(opts.nodes))
    )
    phases = {"publish_s": round(time.monotonic() - start, 1)}
    progress(f"{label}: {opts.nodes} slices published in {phases['publish_s']} s")
    rows: list[dict[str, Any]] = []
    for full_pct, stage in ((0.0, "free"), (opts.full * 100, "full")):
        if stage == "full":
            await remove_samples(c)
            phases["fill_s"] = round(await fill(c, bound, filled, gpus), 1)
            progress(f"{label}: {filled} nodes' GPUs taken in {phases['fill_s']} s")
        got = await samples(c, bound, f"{label}-{stage}", opts.samples, kinds)
        for kind in kinds:
            row = {"slices": label, "full_pct": round(full_pct, 1), "claim": kind}
            rows.append(row | summary(got[kind]))
            progress(f"{label} {stage} {kind}: {rows[-1]}")
    await c.delete_all(c.pods)
    await c.delete_all(c.claims)
    await c.until_none(c.claims, 600)
    await c.delete_all(SLICES)
    await c.until_none(SLICES, 300)
    return rows, phases


async def measure(
    opts: Any, templates: dict[str, dict[str, Any]], progress: Progress
) -> dict[str, Any]:
    c = Cluster(opts.kubeconfig, opts.namespace, opts.concurrency)
    bound = Bound(c)
    watcher: asyncio.Task[None] | None = None
    result: dict[str, Any] = {"nodes": opts.nodes, "samples": opts.samples, "full": opts.full}
    try:
        version = await c.api.request("GET", "/version")
        result["kubernetes"] = version.get("gitVersion")
        await clean(c, progress)
        await namespace(c)
        result["nodes_ready_s"] = round(await make_nodes(c, opts.nodes, opts.settle, progress), 1)
        result["node_controller_before"] = await node_writes(c)
        watcher = asyncio.create_task(bound.run())
        rows: list[dict[str, Any]] = []
        for label, template in templates.items():
            got, phases = await variant(c, bound, label, template, opts=opts, progress=progress)
            rows += got
            result[f"phases {label}"] = phases
        result["rows"] = rows
        result["node_controller_after"] = await node_writes(c)
        result["load_average"] = list(os.getloadavg())
        return result
    finally:
        if watcher is not None:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        if not opts.keep:
            await clean(c, progress)
            await c.delete(f"/api/v1/namespaces/{c.ns}")
        await c.api.aclose()


def run(opts: Any, templates: dict[str, dict[str, Any]], progress: Progress) -> dict[str, Any]:
    return asyncio.run(measure(opts, templates, progress))
