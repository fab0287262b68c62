"""The tool's API calls, through the agent's own client: create-or-replace, delete at
once, list, and the API server's metrics text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from agents.cluster.access import from_kubeconfig
from agents.cluster.client import ApiClient, ApiError

GROUPS = {
    "Namespace": ("/api/v1", "namespaces", False),
    "Node": ("/api/v1", "nodes", False),
    "Pod": ("/api/v1", "pods", True),
    "ServiceAccount": ("/api/v1", "serviceaccounts", True),
    "Lease": ("/apis/coordination.k8s.io/v1", "leases", True),
    "DeviceClass": ("/apis/resource.k8s.io/v1", "deviceclasses", False),
    "ResourceClaimTemplate": ("/apis/resource.k8s.io/v1", "resourceclaimtemplates", True),
    "ResourceSlice": ("/apis/resource.k8s.io/v1", "resourceslices", False),
    "ClusterRole": ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", False),
    "ClusterRoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings", False),
    "FlowSchema": ("/apis/flowcontrol.apiserver.k8s.io/v1", "flowschemas", False),
}
NOW = {"gracePeriodSeconds": 0, "propagationPolicy": "Background"}


def path_of(kind: str, namespace: str = "", name: str = "") -> str:
    prefix, plural, namespaced = GROUPS[kind]
    where = f"/namespaces/{namespace}" if namespaced and namespace else ""
    return f"{prefix}{where}/{plural}" + (f"/{name}" if name else "")


class Api:
    """The admin's client; `close` ends it."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.access = from_kubeconfig(kubeconfig)
        self.client = ApiClient(self.access, timeout_s=30.0)
        self._raw = httpx.AsyncClient(base_url=self.access.server, verify=self.access.tls or True)

    async def close(self) -> None:
        await self.client.aclose()
        await self._raw.aclose()

    async def apply(self, obj: dict[str, Any], namespace: str = "") -> dict[str, Any]:
        """Create, or replace what is there under that name."""
        meta = obj["metadata"]
        try:
            return await self.client.request("POST", path_of(obj["kind"], namespace), obj)
        except ApiError as exc:
            if exc.status != 409:
                raise
        path = path_of(obj["kind"], namespace, meta["name"])
        current = await self.client.request("GET", path)
        meta["resourceVersion"] = current["metadata"]["resourceVersion"]
        return await self.client.request("PUT", path, obj)

    async def delete(self, kind: str, name: str, namespace: str = "") -> bool:
        """Delete at once (no grace: no kubelet would confirm); False if it was not there."""
        try:
            await self.client.request("DELETE", path_of(kind, namespace, name), NOW)
        except ApiError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def delete_labelled(self, kind: str, label: str, namespace: str = "") -> None:
        path = path_of(kind, namespace) + f"?labelSelector={label}"
        for item in (await self.client.list(path)).items:
            await self.delete(kind, item["metadata"]["name"], namespace)

    async def metrics(self) -> str:
        """The API server's /metrics text."""
        response = await self._raw.get("/metrics", timeout=30.0)
        response.raise_for_status()
        return response.text
