"""The cluster of KUBECONFIG through kubectl: objects as JSON, waits with deadlines, and
a helper pod on the agent's node that reads and edits the host's files for the suite."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[2]
# A cluster that needs something of its own (e.g. the service-account token volume where
# the API server lacks its admission plugin) names a kustomization built on this one.
OVERLAY = Path(os.environ.get("NODE_AGENT_E2E_OVERLAY") or REPO / "tests/e2e/overlay")
AGENT_NS = "node-agents"
AGENT_DS = "node-agent"
AGENT_LABEL = "app.kubernetes.io/name=node-agent"
SUITE_NS = "node-agents-e2e"
SIM_DIR = "/var/lib/node-agent-sim"  # the lab's --simulate-root, a hostPath
NODE_FILE = f"{SIM_DIR}/node.yaml"
DEVICE_PLUGINS = "/var/lib/kubelet/device-plugins"
GPU, NIC = "nvidia.com/gpu", "rdma/roce"
IMAGE = os.environ.get("NODE_AGENT_E2E_IMAGE", "localhost/node-agent:dev")

T = TypeVar("T")


def kubectl(*args: str, timeout: float = 120, check: bool = True, stdin: str | None = None) -> str:
    out = subprocess.run(
        ["kubectl", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if check and out.returncode != 0:
        raise AssertionError(f"kubectl {shlex.join(args)} failed:\n{out.stdout}{out.stderr}")
    return out.stdout


def get(*args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json"))


def apply_objects(*objs: dict[str, Any]) -> None:
    kubectl(
        "apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": objs})
    )


def poll(value: Callable[[], T | None], within: float, what: str, every: float = 0.5) -> T:
    """The first truthy value() within the deadline; fails naming `what` otherwise."""
    deadline = time.monotonic() + within
    while True:
        got = value()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within:.0f}s waiting for {what}")
        time.sleep(every)  # the API server is asked at most twice a second


def allocatable(node: str) -> dict[str, int]:
    status = get("node", node)["status"]
    return {k: int(v) for k, v in status.get("allocatable", {}).items() if k in (GPU, NIC)}


def capacity(node: str) -> dict[str, int]:
    status = get("node", node)["status"]
    return {k: int(v) for k, v in status.get("capacity", {}).items() if k in (GPU, NIC)}


def agent_pods(node: str) -> list[dict[str, Any]]:
    pods = get(
        "pods", "-n", AGENT_NS, "-l", AGENT_LABEL, "--field-selector", f"spec.nodeName={node}"
    )
    items: list[dict[str, Any]] = pods["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def restart_count(pod: dict[str, Any]) -> int:
    statuses = pod.get("status", {}).get("containerStatuses", [])
    return sum(int(s.get("restartCount", 0)) for s in statuses)


def pod_phase(namespace: str, name: str) -> str:
    pod = get("pod", "-n", namespace, name)
    phase: str = pod["status"].get("phase", "")
    return phase


def exec_in(namespace: str, pod: str, *command: str, timeout: float = 60) -> str:
    return kubectl("exec", "-n", namespace, pod, "--", *command, timeout=timeout)


@dataclass
class Helper:
    """A pod on the agent's node with the host's simulator root (read-write), the
    device-plugin directory and the cgroup tree (read-only), running the agent's image
    for its Python and coreutils."""

    node: str
    name: str = "e2e-helper"

    def manifest(self) -> dict[str, Any]:
        mounts = [
            ("sim", SIM_DIR, SIM_DIR, False, "DirectoryOrCreate"),
            ("plugins", DEVICE_PLUGINS, "/host/device-plugins", True, "Directory"),
            ("cgroup", "/sys/fs/cgroup", "/host/cgroup", True, "Directory"),
        ]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.name, "namespace": SUITE_NS},
            "spec": {
                "nodeName": self.node,
                "hostNetwork": True,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "tolerations": [{"operator": "Exists"}],
                "containers": [
                    {
                        "name": "helper",
                        "image": IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sleep", "infinity"],
                        "securityContext": {"runAsUser": 0},
                        "volumeMounts": [
                            {"name": n, "mountPath": inside, "readOnly": ro}
                            for n, _, inside, ro, _ in mounts
                        ],
                    }
                ],
                "volumes": [
                    {"name": n, "hostPath": {"path": host, "type": kind}}
                    for n, host, _, _, kind in mounts
                ],
            },
        }

    def start(self) -> None:
        apply_objects(self.manifest())
        poll(lambda: pod_phase(SUITE_NS, self.name) == "Running", 120, "the helper pod")

    def python(self, script: str, *args: str) -> str:
        return exec_in(SUITE_NS, self.name, "python3", "-c", script, *args)

    def write_node_file(self, text: str) -> None:
        """Replace the node file atomically (a rename in its directory), as an edit."""
        self.python(
            "import os,sys;p=sys.argv[1];t=p+'.tmp';open(t,'w').write(sys.argv[2]);os.replace(t,p)",
            NODE_FILE,
            text,
        )

    def read_node_file(self) -> str:
        return self.python("import sys;print(open(sys.argv[1]).read(),end='')", NODE_FILE)

    def plugin_sockets(self) -> list[str]:
        out = self.python("import os;print('\\n'.join(os.listdir('/host/device-plugins')))")
        return sorted(n for n in out.split() if n.startswith("node-agent-") and n.endswith(".sock"))

    def sim_subtree_exists(self) -> bool:
        out = self.python(f"import os;print(os.path.exists('{SIM_DIR}/node-agent-sim'))")
        return out.strip() == "True"

    def pod_memory_bytes(self, pod_uid: str) -> int | None:
        """The memory the pod's cgroup charges (v2 memory.current, v1 usage_in_bytes)."""
        script = (
            "import os,sys\n"
            "uid=sys.argv[1]\n"
            "for top,dirs,files in os.walk('/host/cgroup'):\n"
            "  base=os.path.basename(top)\n"
            "  if uid in base or uid.replace('-','_') in base:\n"
            "    for f in ('memory.current','memory.usage_in_bytes'):\n"
            "      if f in files:\n"
            "        print(open(os.path.join(top,f)).read().strip());sys.exit()\n"
            "    dirs[:]=[]\n"
        )
        out = self.python(script, pod_uid).strip()
        return int(out) if out else None
