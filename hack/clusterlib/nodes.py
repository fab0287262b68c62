"""The simulated nodes' Node objects: created Ready, kept Ready by the heartbeat a kubelet
sends (its Lease renewed every 10 s), tainted so that only this tool's pods land there,
and (for the device plugins' contrast) their allocatable patched as a kubelet reports it."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Mapping
from typing import Any

from hack.clusterlib.api import Api, path_of
from hack.clusterlib.layouts import Layout
from hack.clusterlib.workload import GPU_RESOURCE, LABEL, NIC_RESOURCE

LEASES = "kube-node-lease"
HEARTBEAT_S = 10.0  # the kubelet's lease renewal period
BASE = {"cpu": "64", "memory": "512Gi", "pods": "110"}


def now(micro: bool = False) -> str:
    stamp = datetime.datetime.now(datetime.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def node_object(name: str) -> dict[str, Any]:
    """A Node with no kubelet behind it: Ready (the heartbeat keeps it so), tainted so
    that only pods that tolerate it (this tool's) are placed there."""
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "KubeletReady",
        "message": "simulated node: no kubelet, its lease renewed by hack/cluster_sim",
        "lastHeartbeatTime": now(),
        "lastTransitionTime": now(),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", LABEL: "true"},
        },
        "spec": {"taints": [{"key": LABEL, "value": "true", "effect": "NoSchedule"}]},
        "status": {"capacity": dict(BASE), "allocatable": dict(BASE), "conditions": [ready]},
    }


class Nodes:
    """Our Node objects and their heartbeats; `remove` deletes them all."""

    def __init__(self, api: Api, layouts: Mapping[str, Layout]) -> None:
        self.api = api
        self.layouts = dict(layouts)
        self._beat: asyncio.Task[None] | None = None

    async def create(self) -> None:
        for name in self.layouts:
            node = await self.api.apply(node_object(name))
            await self._renew(name, node["metadata"]["uid"])
        self._beat = asyncio.create_task(self._heartbeats())

    async def _renew(self, name: str, uid: str | None = None) -> None:
        lease: dict[str, Any] = {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": name, "namespace": LEASES},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now(True)},
        }
        if uid is not None:
            lease["metadata"]["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": name, "uid": uid}
            ]
            await self.api.apply(lease, LEASES)
            return
        patch = {"spec": {"renewTime": now(True)}}
        await self.api.client.request(
            "PATCH", path_of("Lease", LEASES, name), patch, "application/merge-patch+json"
        )

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            for name in self.layouts:
                await self._renew(name)

    async def counts(self, on: bool) -> None:
        """Report (or stop reporting) the device plugins' counts in capacity/allocatable."""
        for name, lay in self.layouts.items():
            extra = {GPU_RESOURCE: str(len(lay.of("gpu"))), NIC_RESOURCE: str(len(lay.of("nic")))}
            # A merge patch's null removes a key: no counts reported any more.
            values: dict[str, str | None] = (
                {**BASE, **extra}
                if on
                else {
                    **BASE,
                    GPU_RESOURCE: None,
                    NIC_RESOURCE: None,
                }
            )
            status = {"capacity": values, "allocatable": values}
            await self.api.client.request(
                "PATCH",
                path_of("Node", name=name) + "/status",
                {"status": status},
                "application/merge-patch+json",
            )

    async def remove(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            await asyncio.gather(self._beat, return_exceptions=True)
        for name in self.layouts:
            await self.api.delete("Node", name)
            await self.api.delete("Lease", name, LEASES)
