"""The agent as users run it: the DaemonSet of daemonset/base from the project's image on a
real cluster (KUBECONFIG), a simulated 8-GPU, 8-NIC node under --simulate-root. In file
order: capacity on the Node, pods given paired GPUs and NICs with their device nodes, a
rollout restart in the middle of a workload, a kubelet restart, XID 79 and a link down
lowering allocatable, the agent's memory in its cgroup, the liveness probe, and
`kubectl delete -k` leaving no socket. Run with hack/e2e; figures are printed as E2E."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.sim.bundled import bundled_node
from tests.e2e.cluster import (
    DAEMONSET,
    GPU,
    NAMESPACE,
    NIC,
    PLUGIN_DIR,
    REPO,
    SIM_DIR,
    agent_pods,
    allocatable,
    delete_pods,
    kubectl,
    node_name,
    overlay,
    pod_manifest,
    run_pod,
    wait_for,
    write_node,
)

NODE = "h100-8gpu-8nic"
FULL = {GPU: 8, NIC: 8}
KUBELET_RESTART = os.environ.get(
    "E2E_KUBELET_RESTART",
    f"{REPO.parent}/shared/k8s-lab/down.sh kubelet && {REPO.parent}/shared/k8s-lab/up.sh",
)


@dataclass
class Deployment:
    overlay: Path
    doc: dict[str, Any]
    pairs: dict[str, set[str]]  # GPU UUID -> the HCAs at its smallest distance
    figures: dict[str, float] = field(default_factory=dict)
    paired: list[bool] = field(default_factory=list)  # one per GPU+NIC pod

    def check_paired(self, env: dict[str, str]) -> None:
        gpus = env["NVIDIA_VISIBLE_DEVICES"].split(",")
        hcas = {h.split(":")[0] for h in env["NCCL_IB_HCA"].removeprefix("=").split(",")}
        want = set().union(*(self.pairs[g] for g in gpus))
        self.paired.append(hcas == want)
        assert hcas == want, (gpus, hcas, want)


def _pairs() -> dict[str, set[str]]:
    done = subprocess.run(
        [sys.executable, "-m", "agents.cli", "topo", "--simulate", NODE, "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    report = json.loads(done.stdout)
    uuid = {g["name"]: g["uuid"] for g in report["gpus"]}
    return {uuid[name]: set(p["nics"]) for name, p in report["pairs"].items()}


@pytest.fixture(scope="module")
def deployed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    node = node_name()
    kubectl("label", "node", node, "node-agents.io/gpu-node=true", "--overwrite")
    SIM_DIR.mkdir(parents=True, exist_ok=True)
    doc = yaml.safe_load(bundled_node(NODE).read_text())
    write_node(doc)
    deployment = Deployment(overlay(tmp_path_factory.mktemp("overlay"), node), doc, _pairs())
    began = time.monotonic()
    kubectl("apply", "-k", str(deployment.overlay))
    wait_for("8 GPUs and 8 NICs allocatable", lambda: allocatable() == FULL)
    deployment.figures["apply_to_allocatable_s"] = time.monotonic() - began
    try:
        yield deployment
    finally:
        print("E2E", json.dumps({k: round(v, 2) for k, v in deployment.figures.items()}))
        print("E2E paired", sum(deployment.paired), "of", len(deployment.paired))
        delete_pods()
        subprocess.run(
            ["kubectl", "delete", "-k", str(deployment.overlay), "--ignore-not-found"],
            capture_output=True,
            check=False,
        )


def test_capacity_shows_on_the_node(deployed: Deployment) -> None:
    describe = kubectl("describe", "node", node_name())
    assert re.search(rf"{re.escape(GPU)}:\s+8", describe), describe
    assert re.search(rf"{re.escape(NIC)}:\s+8", describe), describe
    (pod,) = agent_pods()
    context = pod["spec"]["containers"][0]["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"], "add": ["MKNOD"]}


def test_pods_get_paired_gpus_and_nics_with_their_device_nodes(deployed: Deployment) -> None:
    env = run_pod("e2e-pair-a", 2, 2)
    deployed.check_paired(env)
    hcas = [h.split(":")[0] for h in env["NCCL_IB_HCA"].removeprefix("=").split(",")]
    uverbs = {
        n["rdma"]: n.get("uverbs", int(n["rdma"].rsplit("_", 1)[1])) for n in deployed.doc["nics"]
    }
    for hca in hcas:
        kubectl("exec", "e2e-pair-a", "--", "test", "-c", f"/dev/infiniband/uverbs{uverbs[hca]}")
    kubectl("exec", "e2e-pair-a", "--", "test", "-c", "/dev/infiniband/rdma_cm")


def test_rollout_restart_in_the_middle_of_a_workload_pairs_every_pod(
    deployed: Deployment,
) -> None:
    (old,) = agent_pods()
    began = time.monotonic()
    kubectl("rollout", "restart", f"daemonset/{DAEMONSET}", "-n", NAMESPACE)
    # A pod asked for while the agent restarts: admitted once the new agent registers.
    kubectl("apply", "-f", "-", stdin=_pod("e2e-during-rollout"))
    kubectl("rollout", "status", f"daemonset/{DAEMONSET}", "-n", NAMESPACE, "--timeout=120s")
    wait_for("the new agent registered", lambda: allocatable() == FULL)
    deployed.figures["rollout_to_allocatable_s"] = time.monotonic() - began
    (new,) = agent_pods()
    assert new["metadata"]["uid"] != old["metadata"]["uid"]
    deployed.check_paired(_env_of("e2e-during-rollout"))
    deployed.check_paired(run_pod("e2e-after-rollout", 2, 2))
    logs = kubectl("logs", "-n", NAMESPACE, new["metadata"]["name"])
    assert "pod_resources_unavailable" not in logs, logs[-2000:]


def test_a_kubelet_restart_is_survived(deployed: Deployment) -> None:
    began = time.monotonic()
    subprocess.run(["bash", "-c", KUBELET_RESTART], check=True, capture_output=True, timeout=300)
    wait_for("allocatable again after the kubelet restart", lambda: allocatable() == FULL)
    deployed.figures["kubelet_restart_to_allocatable_s"] = time.monotonic() - began
    deployed.check_paired(run_pod("e2e-after-kubelet", 1, 1))


def test_xid_79_and_a_link_down_lower_allocatable(deployed: Deployment) -> None:
    doc = deployed.doc
    doc["gpus"][6]["xids"] = [*doc["gpus"][6].get("xids", []), 79]
    began = time.monotonic()
    write_node(doc)
    wait_for("one GPU fewer", lambda: allocatable() == {GPU: 7, NIC: 8}, 60)
    deployed.figures["xid79_to_allocatable_s"] = time.monotonic() - began
    doc["nics"][7]["link"] = "down"
    began = time.monotonic()
    write_node(doc)
    wait_for("one NIC fewer", lambda: allocatable() == {GPU: 7, NIC: 7}, 60)
    deployed.figures["link_down_to_allocatable_s"] = time.monotonic() - began
    doc["nics"][7]["link"] = "up"
    write_node(doc)
    wait_for("the NIC back", lambda: allocatable() == {GPU: 7, NIC: 8}, 60)


def test_the_agent_memory_in_its_cgroup(deployed: Deployment) -> None:
    (pod,) = agent_pods()
    status = kubectl(
        "exec", "-n", NAMESPACE, pod["metadata"]["name"], "--", "cat", "/proc/1/status"
    )
    rss = int(re.search(r"VmRSS:\s+(\d+) kB", status)[1])  # type: ignore[index]
    deployed.figures["agent_rss_mib"] = rss / 1024
    cgroup = _cgroup_memory()
    if cgroup is not None:
        deployed.figures["agent_cgroup_memory_mib"] = cgroup / 2**20
    assert rss < 192 * 1024  # the DaemonSet's limit


def test_the_liveness_probe_keeps_the_agent_running(deployed: Deployment) -> None:
    (pod,) = agent_pods()
    (container,) = pod["status"]["containerStatuses"]
    assert container["ready"] is True
    assert container["restartCount"] == 0
    assert pod["spec"]["containers"][0]["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_delete_leaves_no_socket(deployed: Deployment) -> None:
    delete_pods()
    kubectl("delete", "-k", str(deployed.overlay), "--wait=true", timeout=180)
    wait_for("the agent gone", lambda: not agent_pods() or None, 120)
    left = sorted(p.name for p in PLUGIN_DIR.glob("node-agent-*.sock"))
    assert left == []
    assert all(deployed.paired), deployed.paired


def _pod(name: str) -> str:
    return pod_manifest(name, 2, 2)


def _env_of(name: str) -> dict[str, str]:
    wait_for(
        f"pod {name} running",
        lambda: kubectl("get", "pod", name, "-o", "jsonpath={.status.phase}") == "Running",
        180,
    )
    env = kubectl("exec", name, "--", "env")
    return dict(line.split("=", 1) for line in env.splitlines() if "=" in line)


def _cgroup_memory() -> int | None:
    """The agent container's memory as its cgroup counts it, read on the node."""
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            cgroups = (proc / "cgroup").read_text()
        except OSError:
            continue
        if b"run" not in cmdline or not any(b"node-agent" in c for c in cmdline):
            continue
        if str(SIM_DIR) not in " ".join(c.decode(errors="replace") for c in cmdline):
            continue
        for line in cgroups.splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers in ("", "memory"):
                base = Path("/sys/fs/cgroup") / ("memory" if controllers else "")
                for name in ("memory.current", "memory.usage_in_bytes"):
                    f = base / path.lstrip("/") / name
                    if f.exists():
                        return int(f.read_text())
    return None
