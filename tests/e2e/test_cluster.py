"""The agent on a real cluster, as the DaemonSet from the image: capacity on the Node,
paired pods with their device nodes, the liveness probe, `rollout restart` and a kubelet
restart in the middle of a workload, XID 79 and a link down lowering allocatable, and
`kubectl delete -k` leaving no socket. The tests run in file order, on one deployment."""

from __future__ import annotations

import calendar
import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from tests.e2e.cluster import (
    AGENT_DS,
    AGENT_NS,
    GPU,
    IMAGE,
    NIC,
    OVERLAY,
    SUITE_NS,
    agent_pods,
    allocatable,
    apply_objects,
    capacity,
    exec_in,
    get,
    kubectl,
    pod_phase,
    poll,
    ready,
    restart_count,
)
from tests.e2e.conftest import Deployment

LIVENESS_WINDOW = 45.0  # initialDelaySeconds 10 + failureThreshold 3 x periodSeconds 10, and some
FAULT_WITHIN = 30.0  # the file edit, the health loop, then the kubelet's node status update
pytestmark = pytest.mark.timeout(900)


@dataclass
class Workload:
    """A pod of the suite holding GPUs and NICs, with what it was given."""

    name: str
    gpus: list[str]
    netdevs: list[str]
    device_nodes: dict[str, str]  # path -> file type as stat prints it


class Ledger:
    """The suite's own count of the pairing rate: containers that asked for GPUs and
    NICs when a fully paired choice existed among the free devices, and how many of
    them got one. Free = not held by a running pod of the suite (the suite's pods are
    the only ones asking for these resources on the node under test)."""

    def __init__(self, pairs: dict[str, set[str]]) -> None:
        self.pairs = pairs
        self.held: dict[str, Workload] = {}
        self.counted = 0
        self.paired = 0

    def paired_choice_exists(self, gpus: int) -> bool:
        taken_gpus = {g for w in self.held.values() for g in w.gpus}
        taken_nics = {n for w in self.held.values() for n in w.netdevs}
        whole = [g for g in self.pairs if g not in taken_gpus and self.pairs[g] - taken_nics]
        return len(whole) >= gpus

    def is_paired(self, w: Workload) -> bool:
        wanted = set().union(*(self.pairs[g] for g in w.gpus))
        return set(w.netdevs) <= wanted and len(w.netdevs) == len(w.gpus)

    def run(self, name: str, gpus: int = 2, nics: int = 2) -> Workload:
        existed = self.paired_choice_exists(gpus)
        w = start_workload(name, gpus, nics)
        self.held[name] = w
        if existed:
            self.counted += 1
            self.paired += self.is_paired(w)
            assert self.is_paired(w), f"{name} unpaired although a pair was free: {w}"
        return w

    def end(self, name: str) -> None:
        kubectl("delete", "pod", "-n", SUITE_NS, name, "--wait=true", "--grace-period=0")
        self.held.pop(name)

    def rate(self) -> str:
        return f"{self.paired}/{self.counted}"


def start_workload(name: str, gpus: int, nics: int) -> Workload:
    apply_objects(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": SUITE_NS},
            "spec": {
                # The host's network namespace, as RoCE workloads commonly run (and
                # the only network some lab clusters have).
                "hostNetwork": True,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "tolerations": [{"operator": "Exists"}],
                "nodeSelector": {"node-agents.io/gpu-node": "true"},
                "containers": [
                    {
                        "name": "work",
                        "image": IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sleep", "infinity"],
                        "resources": {"limits": {GPU: str(gpus), NIC: str(nics)}},
                    }
                ],
            },
        }
    )
    poll(lambda: pod_phase(SUITE_NS, name) == "Running", 120, f"{name} Running")
    env = dict(
        line.split("=", 1)
        for line in exec_in(SUITE_NS, name, "printenv").splitlines()
        if "=" in line
    )
    stat = exec_in(SUITE_NS, name, "sh", "-c", "stat -c '%n|%F' /dev/infiniband/*")
    nodes = dict(line.split("|", 1) for line in stat.splitlines())
    return Workload(
        name,
        env["NVIDIA_VISIBLE_DEVICES"].split(","),
        env["RDMA_NETDEVS"].split(","),
        nodes,
    )


@pytest.fixture(scope="module")
def ledger(pairs: dict[str, set[str]], deployment: Deployment) -> Iterator[Ledger]:
    book = Ledger(pairs)
    yield book
    deployment.figures["pods paired"] = book.rate()


def the_agent(deployment: Deployment) -> dict[str, Any]:
    (pod,) = agent_pods(deployment.node)
    return pod


def test_the_node_shows_8_gpus_and_8_nics_in_capacity_and_allocatable(
    deployment: Deployment,
) -> None:
    assert capacity(deployment.node) == {GPU: 8, NIC: 8}
    assert allocatable(deployment.node) == {GPU: 8, NIC: 8}


def test_the_liveness_probe_passes_and_healthz_answers(deployment: Deployment) -> None:
    pod = the_agent(deployment)
    started = pod["status"]["startTime"]
    poll(
        lambda: time.time() - _epoch(started) > LIVENESS_WINDOW,
        LIVENESS_WINDOW + 10,
        "the probe's failure window",
        every=2,
    )
    pod = the_agent(deployment)
    assert ready(pod) and restart_count(pod) == 0
    url = f"http://{pod['status']['podIP']}:17400/healthz"
    code = exec_in(
        AGENT_NS,
        pod["metadata"]["name"],
        "python3",
        "-c",
        f"import urllib.request as u;print(u.urlopen('{url}').status)",
    )
    assert code.strip() == "200"
    memory = deployment.helper.pod_memory_bytes(pod["metadata"]["uid"])
    deployment.figures["agent pod memory (cgroup)"] = (
        f"{memory / 2**20:.0f} MiB" if memory else "cgroup not found"
    )


def test_pods_of_gpus_and_nics_run_paired_with_their_device_nodes(ledger: Ledger) -> None:
    for i in range(2):
        w = ledger.run(f"pair-{i}")
        uverbs = {p for p in w.device_nodes if "uverbs" in p}
        assert len(uverbs) == 2 and "/dev/infiniband/rdma_cm" in w.device_nodes
        assert set(w.device_nodes.values()) == {"character special file"}, w.device_nodes


def test_rollout_restart_mid_workload_keeps_pods_and_pairs_the_next(
    deployment: Deployment, ledger: Ledger
) -> None:
    before = the_agent(deployment)["metadata"]["uid"]
    started = time.monotonic()
    kubectl("rollout", "restart", f"daemonset/{AGENT_DS}", "-n", AGENT_NS)
    kubectl(
        "rollout", "status", f"daemonset/{AGENT_DS}", "-n", AGENT_NS, "--timeout=180s", timeout=200
    )
    poll(
        lambda: (
            [p for p in agent_pods(deployment.node) if p["metadata"]["uid"] != before and ready(p)]
            and allocatable(deployment.node) == {GPU: 8, NIC: 8}
        ),
        120,
        "the new agent registered",
    )
    deployment.figures["rollout restart -> allocatable"] = f"{time.monotonic() - started:.1f} s"
    for name in list(ledger.held):
        assert pod_phase(SUITE_NS, name) == "Running", name
    # The new agent knows the held devices from the kubelet (pod-resources, read-only
    # mount), so the next pod gets a whole pair among the free ones.
    ledger.run("after-rollout")
    logs = kubectl("logs", "-n", AGENT_NS, the_agent(deployment)["metadata"]["name"])
    assert "pod_resources_unavailable" not in logs


def test_kubelet_restart_mid_workload_registers_again_and_pairs_the_next(
    deployment: Deployment, ledger: Ledger
) -> None:
    command = os.environ.get("NODE_AGENT_E2E_RESTART_KUBELET")
    if not command:
        pytest.skip("set NODE_AGENT_E2E_RESTART_KUBELET to a command that restarts the kubelet")
    agent = the_agent(deployment)
    subprocess.run(command, shell=True, check=True, timeout=300)
    poll(lambda: allocatable(deployment.node) == {GPU: 8, NIC: 8}, 180, "8 and 8 again")
    after = the_agent(deployment)
    assert after["metadata"]["uid"] == agent["metadata"]["uid"]
    assert restart_count(after) == restart_count(agent)
    for name in list(ledger.held):
        assert pod_phase(SUITE_NS, name) == "Running", name
    ledger.run("after-kubelet-restart")


def _edit(deployment: Deployment, change: Any) -> None:
    doc = yaml.safe_load(deployment.helper.read_node_file())
    change(doc)
    deployment.helper.write_node_file(yaml.safe_dump(doc, sort_keys=False))


def test_xid_79_and_a_link_down_lower_allocatable_and_recover(
    deployment: Deployment, ledger: Ledger
) -> None:
    node = deployment.node
    for name in list(ledger.held):
        ledger.end(name)
    started = time.monotonic()
    _edit(deployment, lambda d: d["gpus"][3]["xids"].append(79))
    poll(lambda: allocatable(node).get(GPU) == 7, FAULT_WITHIN, "allocatable GPUs 7")
    deployment.figures["XID 79 -> allocatable"] = f"{time.monotonic() - started:.1f} s"
    started = time.monotonic()
    _set_link(deployment, 5, "down")
    poll(lambda: allocatable(node).get(NIC) == 7, FAULT_WITHIN, "allocatable NICs 7")
    deployment.figures["link down -> allocatable"] = f"{time.monotonic() - started:.1f} s"
    _reset(deployment, 3)
    _set_link(deployment, 5, "up")
    poll(lambda: allocatable(node) == {GPU: 8, NIC: 8}, FAULT_WITHIN, "8 and 8 again")


def _reset(deployment: Deployment, gpu: int) -> None:
    """A reset, as on a real node: the GPU leaves the bus (the agent says so) and answers
    again, its XIDs gone."""
    uuid = yaml.safe_load(deployment.node_text)["gpus"][gpu]["uuid"]
    _edit(deployment, lambda d: d["gpus"][gpu].update(xids=[], lost=True))
    poll(lambda: _logged_lost(deployment, uuid), FAULT_WITHIN, f"{uuid} lost in the log")
    _edit(deployment, lambda d: d["gpus"][gpu].update(lost=False))


def _logged_lost(deployment: Deployment, uuid: str) -> bool:
    pod = the_agent(deployment)["metadata"]["name"]
    for line in kubectl("logs", "-n", AGENT_NS, pod).splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        wanted = {"event": "device_unhealthy", "device": uuid, "reason": "lost"}
        if wanted.items() <= event.items():
            return True
    return False


def _agent_events(node: str) -> list[dict[str, Any]]:
    """The agent's Events on the Node, as `kubectl describe node` finds them."""
    selector = f"involvedObject.kind=Node,involvedObject.name={node},source=node-agent"
    items: list[dict[str, Any]] = get("events", "-n", "default", "--field-selector", selector)[
        "items"
    ]
    return items


Counts = dict[str, int]  # Event name -> its count


def _counts(node: str) -> Counts:
    return {e["metadata"]["name"]: int(e.get("count") or 1) for e in _agent_events(node)}


def _counted(node: str, reason: str, needle: str, before: Counts) -> tuple[int, int]:
    """(Event objects, summed count) of one reason whose message holds `needle`, counting
    only what came after `before` (Events of earlier runs live on for an hour)."""
    grown = [
        int(e.get("count") or 1) - before.get(e["metadata"]["name"], 0)
        for e in _agent_events(node)
        if e["reason"] == reason and needle in e["message"]
    ]
    grown = [g for g in grown if g > 0]
    return len(grown), sum(grown)


def _condition(node: str) -> dict[str, Any] | None:
    for c in get("node", node)["status"].get("conditions", []):
        if c["type"] == "DevicesHealthy":
            found: dict[str, Any] = c
            return found
    return None


def test_faults_reach_the_cluster_as_events_and_the_devices_healthy_condition(
    deployment: Deployment,
) -> None:
    """The reports to the cluster on a real API server: XID 79 -> a Warning Event naming the GPU and
    the XID within 2 s of the fault (the kubelet cannot have seen it earlier), the
    condition False naming it; a reset -> a Normal Event, the condition True; 20 link
    flaps -> a few Event objects whose counts add up to 20 each way."""
    node = deployment.node
    doc = yaml.safe_load(deployment.node_text)
    uuid, netdev = doc["gpus"][2]["uuid"], doc["nics"][6]["netdev"]
    poll(lambda: (_condition(node) or {}).get("status") == "True", 60, "DevicesHealthy True")
    before = _counts(node)

    started = time.monotonic()
    _edit(deployment, lambda d: d["gpus"][2]["xids"].append(79))
    poll(
        lambda: _counted(node, "DeviceUnhealthy", uuid, before)[1] >= 1,
        FAULT_WITHIN,
        f"a Warning Event for {uuid}",
        every=0.05,
    )
    event_s = time.monotonic() - started
    (warning,) = [
        e
        for e in _agent_events(node)
        if uuid in e["message"] and e["metadata"]["name"] not in before
    ]
    assert warning["type"] == "Warning" and "XID 79 (fell off the bus)" in warning["message"]
    poll(lambda: allocatable(node).get(GPU) == 7, FAULT_WITHIN, "allocatable GPUs 7")

    def names_it() -> bool:
        c = _condition(node) or {}
        return c.get("status") == "False" and uuid in c.get("message", "")

    poll(names_it, FAULT_WITHIN, f"DevicesHealthy False naming {uuid}")
    condition_s = time.monotonic() - started
    deployment.figures["XID 79 -> Warning Event on the Node"] = f"{event_s:.2f} s"
    deployment.figures["XID 79 -> DevicesHealthy False"] = f"{condition_s:.2f} s"
    assert event_s <= 2.0, f"the Warning Event came {event_s:.2f} s after the fault"

    _reset(deployment, 2)
    poll(
        lambda: _counted(node, "DeviceHealthy", uuid, before)[1] >= 1,
        FAULT_WITHIN,
        f"a Normal Event for {uuid}",
    )
    poll(lambda: (_condition(node) or {}).get("status") == "True", FAULT_WITHIN, "True again")
    poll(lambda: allocatable(node).get(GPU) == 8, FAULT_WITHIN, "allocatable GPUs 8")

    needle = f"(interface {netdev})"
    for flap in range(1, 21):
        for link, reason in (("down", "DeviceUnhealthy"), ("up", "DeviceHealthy")):
            _set_link(deployment, 6, link)
            _wait_counted(node, reason, needle, flap, before)
    down = _counted(node, "DeviceUnhealthy", needle, before)
    up = _counted(node, "DeviceHealthy", needle, before)
    deployment.figures["20 link flaps -> Event objects (count)"] = (
        f"{down[0]} Warning ({down[1]}) + {up[0]} Normal ({up[1]})"
    )
    assert down[1] == 20 and up[1] == 20, (down, up)
    assert down[0] + up[0] <= 4, (down, up)
    poll(lambda: (_condition(node) or {}).get("status") == "True", FAULT_WITHIN, "True at the end")


def _set_link(deployment: Deployment, nic: int, link: str) -> None:
    _edit(deployment, lambda d: d["nics"][nic].update(link=link))


def _wait_counted(node: str, reason: str, needle: str, times: int, before: Counts) -> None:
    poll(
        lambda: _counted(node, reason, needle, before)[1] >= times,
        FAULT_WITHIN,
        f"{reason} counted {times} times for {needle}",
        every=0.1,
    )


def test_delete_leaves_no_socket_and_no_simulated_tree(deployment: Deployment) -> None:
    kubectl("delete", "-k", str(OVERLAY), "--wait=true", timeout=300)
    deployment.deleted = True
    poll(lambda: not agent_pods(deployment.node), 120, "the agent pod gone")
    assert deployment.helper.plugin_sockets() == []
    assert not deployment.helper.sim_subtree_exists()


def _epoch(rfc3339: str) -> float:
    return calendar.timegm(time.strptime(rfc3339, "%Y-%m-%dT%H:%M:%SZ"))
