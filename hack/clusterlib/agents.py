"""One agent per simulated node in DRA mode, as its own process under a service account
with daemonset/dra's rights, and the API requests they make, counted by the API server itself:
a FlowSchema of their own, read from `apiserver_flowcontrol_dispatched_requests_total`."""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from hack.clusterlib.api import Api
from hack.clusterlib.layouts import GPU_DRIVER, NIC_DRIVER, Layout
from hack.clusterlib.workload import LABEL

ROOT = Path(__file__).resolve().parent.parent.parent
ACCOUNT = "node-agent"
FLOW = "cluster-sim-agents"
LOG_LINE = re.compile(r"^\S+ \[(\w+)\s*\] (\w+)", re.M)
AGENT = f"{shlex.quote(sys.executable)} -m agents.cli run --api dra"


def rbac(namespace: str) -> list[dict[str, Any]]:
    """The service account and the rights daemonset/dra gives it (events,
    the node's status, nodes, claims and slices), no more: a refusal would show."""
    rules = [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaims"],
            "verbs": ["get", "list", "watch"],
        },
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceslices"],
            "verbs": ["create", "get", "list", "watch", "update", "patch", "delete"],
        },
    ]
    meta = {"name": FLOW, "labels": {LABEL: "true"}}
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": ACCOUNT, "namespace": namespace, "labels": {LABEL: "true"}},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": meta,
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": meta,
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": FLOW,
            },
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": namespace}],
        },
    ]


def flow_schema(namespace: str) -> dict[str, Any]:
    """Every request of the agents' service account, and nothing else, in a flow of its own."""
    return {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1",
        "kind": "FlowSchema",
        "metadata": {"name": FLOW, "labels": {LABEL: "true"}},
        "spec": {
            "priorityLevelConfiguration": {"name": "workload-low"},
            "matchingPrecedence": 200,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [
                {
                    "subjects": [
                        {
                            "kind": "ServiceAccount",
                            "serviceAccount": {"name": ACCOUNT, "namespace": namespace},
                        }
                    ],
                    "resourceRules": [
                        {
                            "verbs": ["*"],
                            "apiGroups": ["*"],
                            "resources": ["*"],
                            "clusterScope": True,
                            "namespaces": ["*"],
                        }
                    ],
                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
                }
            ],
        },
    }


def dispatched(metrics: str) -> int:
    """Requests of our FlowSchema the API server has dispatched since it started."""
    pattern = re.compile(
        r"^apiserver_flowcontrol_dispatched_requests_total\{([^}]*)\}\s+([0-9.e+]+)$", re.M
    )
    return sum(
        int(float(value))
        for labels, value in pattern.findall(metrics)
        if f'flow_schema="{FLOW}"' in labels
    )


class Agents:
    """The agent processes; `stop` ends them and deletes their slices."""

    def __init__(self, api: Api, namespace: str, work: Path, command: str = AGENT) -> None:
        self.api, self.namespace, self.work, self.command = api, namespace, work, command
        self.processes: dict[str, asyncio.subprocess.Process] = {}
        self._started: list[str] = []

    async def setup(self) -> None:
        for obj in rbac(self.namespace):
            await self.api.apply(obj, self.namespace)
        await self.api.apply(flow_schema(self.namespace))

    async def kubeconfig(self) -> Path:
        """A kubeconfig with a one-hour token of the agents' service account."""
        path = f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{ACCOUNT}/token"
        answer = await self.api.client.request(
            "POST",
            path,
            {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 3600},
            },
        )
        admin = yaml.safe_load(self.api.kubeconfig.read_text())
        cluster = admin["clusters"][0]["cluster"]
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "lab", "cluster": cluster}],
            "users": [{"name": ACCOUNT, "user": {"token": answer["status"]["token"]}}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": ACCOUNT}}],
            "current-context": "lab",
        }
        out = self.work / "agent.kubeconfig"
        out.write_text(yaml.safe_dump(doc))
        out.chmod(0o600)
        return out

    async def start(self, layouts: Mapping[str, Layout]) -> None:
        kubeconfig = await self.kubeconfig()
        for node, lay in layouts.items():
            home = self.work / node
            dirs = {d: home / d for d in ("plugins", "registry", "cdi", "dp")}
            for d in dirs.values():
                d.mkdir(parents=True, exist_ok=True)
            node_file = lay.write(home / f"{lay.name}.yaml")
            args = [
                *shlex.split(self.command),
                *("--simulate", str(node_file), "--node-name", node),
                *("--kubeconfig", str(kubeconfig)),
                *("--kubelet-plugins-dir", str(dirs["plugins"])),
                *("--kubelet-registry-dir", str(dirs["registry"])),
                *("--cdi-root", str(dirs["cdi"]), "--device-plugin-dir", str(dirs["dp"])),
                # No kubelet: not the lab kubelet's pod-resources either.
                *("--pod-resources-socket", str(home / "no-kubelet.sock")),
            ]
            self._started.append(node)
            log = (home / "agent.log").open("wb")
            env = {k: v for k, v in os.environ.items() if k != "NODE_NAME"}
            self.processes[node] = await asyncio.create_subprocess_exec(
                *args,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()

    async def published(self, layouts: Mapping[str, Layout], within: float) -> float:
        """Wait until every node's slices list all its devices; seconds it took."""
        start = time.monotonic()
        want = {
            (node, driver): len(lay.of(kind))
            for node, lay in layouts.items()
            for kind, driver in (("gpu", GPU_DRIVER), ("nic", NIC_DRIVER))
        }
        while time.monotonic() - start < within:
            self.check_alive()
            have: dict[tuple[str, str], int] = {}
            for s in (await self.api.client.list("/apis/resource.k8s.io/v1/resourceslices")).items:
                key = (s["spec"].get("nodeName", ""), s["spec"]["driver"])
                have[key] = have.get(key, 0) + len(s["spec"].get("devices") or [])
            if all(have.get(k, 0) >= n for k, n in want.items()):
                return time.monotonic() - start
            await asyncio.sleep(0.5)
        raise TimeoutError(f"slices not all published within {within:g} s")

    def check_alive(self) -> None:
        for node, process in self.processes.items():
            if process.returncode is not None:
                tail = (self.work / node / "agent.log").read_text()[-1500:]
                raise RuntimeError(f"agent of {node} exited {process.returncode}: {tail}")

    async def stop(self, layouts: Mapping[str, Layout]) -> None:
        for process in self.processes.values():
            if process.returncode is None:
                process.terminate()
        for process in self.processes.values():
            try:
                await asyncio.wait_for(process.wait(), 20)
            except TimeoutError:
                process.kill()
                await process.wait()
        self.processes.clear()
        for s in (await self.api.client.list("/apis/resource.k8s.io/v1/resourceslices")).items:
            if s["spec"].get("nodeName") in layouts:
                await self.api.delete("ResourceSlice", s["metadata"]["name"])

    def log_warnings(self) -> dict[str, int]:
        """Warning and error events in the agents' logs, by name, all agents together."""
        found: Counter[str] = Counter()
        for node in self.processes or self._started:
            text = (self.work / node / "agent.log").read_text(errors="replace")
            for level, event in LOG_LINE.findall(text):
                if level in ("warning", "error", "critical"):
                    found[event] += 1
        return dict(found)

    async def requests(self) -> int:
        return dispatched(await self.api.metrics())
