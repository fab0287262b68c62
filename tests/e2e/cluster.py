"""A real cluster through kubectl: the agent deployed as the DaemonSet of daemonset/base,
with an overlay made here that adds only what a simulated node needs (--simulate,
--simulate-root with a hostPath at the same path, CAP_MKNOD), and pods that ask for its
devices. The suite runs on the node itself (a single-node lab): it edits the simulated
node's file and looks into the kubelet's device-plugin directory."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "node-agents"
DAEMONSET = "node-agent"
GPU = "nvidia.com/gpu"
NIC = "rdma/roce"
SIM_DIR = Path(os.environ.get("E2E_SIM_DIR", "/var/lib/node-agent-sim"))
NODE_FILE = SIM_DIR / "node.yaml"
PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
IMAGE = os.environ.get("E2E_IMAGE", "localhost/node-agents:e2e")
WORKLOAD_IMAGE = os.environ.get("E2E_WORKLOAD_IMAGE", "k8s.local/busybox:1.35")
KUBECTL = os.environ.get("KUBECTL") or shutil.which("kubectl") or "kubectl"
T = TypeVar("T")


class KubectlError(RuntimeError):
    pass


def kubectl(*args: str, stdin: str | None = None, timeout: float = 120) -> str:
    done = subprocess.run(
        [KUBECTL, *args], input=stdin, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode:
        raise KubectlError(f"kubectl {' '.join(args)}: {done.stderr.strip()[-2000:]}")
    return done.stdout


def kubectl_json(*args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json"))


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 120.0) -> T:
    """Poll the cluster until `check` gives a truthy value (the API server is polled, no
    thread is synchronised by time)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except KubectlError as exc:
            value, last = None, exc
        if value:
            return value
        time.sleep(0.2)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last})")


def node_name() -> str:
    names = kubectl("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}").split()
    if len(names) != 1:
        raise RuntimeError(f"the end-to-end suite needs a single-node cluster, got {names}")
    return names[0]


def allocatable() -> dict[str, int]:
    status = kubectl_json("get", "node", node_name())["status"]
    return {r: int(status["allocatable"].get(r, 0)) for r in (GPU, NIC)}


def overlay(directory: Path, node: str) -> Path:
    """A kustomization over daemonset/base with only the simulated node's additions."""
    directory.mkdir(parents=True, exist_ok=True)
    base = os.path.relpath(REPO / "daemonset" / "base", directory)
    name, _, tag = IMAGE.rpartition(":")
    container = "/spec/template/spec/containers/0"
    patch = [
        {"op": "add", "path": f"{container}/args/-", "value": "--simulate"},
        {"op": "add", "path": f"{container}/args/-", "value": str(NODE_FILE)},
        {"op": "add", "path": f"{container}/args/-", "value": "--simulate-root"},
        {"op": "add", "path": f"{container}/args/-", "value": str(SIM_DIR / "root")},
        {"op": "add", "path": f"{container}/imagePullPolicy", "value": "Never"},
        {
            "op": "add",
            "path": f"{container}/securityContext/capabilities/add",
            "value": ["MKNOD"],
        },
        {
            "op": "add",
            "path": f"{container}/volumeMounts/-",
            "value": {"name": "sim", "mountPath": str(SIM_DIR)},
        },
        {
            "op": "add",
            "path": "/spec/template/spec/volumes/-",
            "value": {"name": "sim", "hostPath": {"path": str(SIM_DIR), "type": "Directory"}},
        },
    ]
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [base],
        "images": [{"name": "ghcr.io/node-agents/node-agent", "newName": name, "newTag": tag}],
        "patches": [
            {"target": {"kind": "DaemonSet", "name": DAEMONSET}, "patch": json.dumps(patch)}
        ],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return directory


def write_node(doc: dict[str, Any]) -> None:
    tmp = NODE_FILE.with_name(NODE_FILE.name + ".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.replace(NODE_FILE)


def pod_manifest(name: str, gpus: int, nics: int) -> str:
    limits = {k: str(v) for k, v in ((GPU, gpus), (NIC, nics)) if v}
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": "default", "labels": {"e2e": "node-agents"}},
            "spec": {
                "hostNetwork": True,
                "terminationGracePeriodSeconds": 1,
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": WORKLOAD_IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["sleep", "3600"],
                        "resources": {"limits": limits},
                    }
                ],
            },
        }
    )


def run_pod(name: str, gpus: int, nics: int, timeout: float = 120) -> dict[str, str]:
    """Start a pod and wait until it runs; its environment."""
    kubectl("apply", "-f", "-", stdin=pod_manifest(name, gpus, nics))
    wait_for(
        f"pod {name} running",
        lambda: kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}") == "Running",
        timeout,
    )
    env = kubectl("exec", name, "--", "env")
    return dict(line.split("=", 1) for line in env.splitlines() if "=" in line)


def delete_pods() -> None:
    kubectl("delete", "pod", "-l", "e2e=node-agents", "--grace-period=1", "--wait=true")


def agent_pods() -> list[dict[str, Any]]:
    pods = kubectl_json("get", "pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=node-agent")
    return list(pods["items"])
