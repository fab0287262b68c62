"""The e2e suite's fixtures: the node under test, the helper pod on it, and the agent
deployed once for the whole session as users deploy it (`kubectl apply -k`).

Run by hack/e2e only (tests/conftest.py leaves tests/e2e out otherwise), against the
cluster of KUBECONFIG with the image of `hack/image --containerd` on the node."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from agents.sim.bundled import bundled_node
from tests.e2e.cluster import (
    GPU,
    NIC,
    OVERLAY,
    SUITE_NS,
    Helper,
    agent_pods,
    allocatable,
    get,
    kubectl,
    poll,
    ready,
)

NODE_LABEL = "node-agents.io/gpu-node"
SIM_NODE = "h100-8gpu-8nic"
DEPLOYED_WITHIN = 180.0


@dataclass
class Deployment:
    node: str
    helper: Helper
    node_text: str  # the node file as first written
    figures: dict[str, str] = field(default_factory=dict)
    deleted: bool = False


def _node_under_test() -> str:
    named = os.environ.get("NODE_AGENT_E2E_NODE")
    if named:
        return named
    nodes: list[str] = [n["metadata"]["name"] for n in get("nodes")["items"]]
    assert len(nodes) == 1, f"several nodes ({nodes}): name one in NODE_AGENT_E2E_NODE"
    return nodes[0]


@pytest.fixture(scope="session")
def deployment() -> Iterator[Deployment]:
    assert os.environ.get("KUBECONFIG"), "the e2e suite runs against the cluster of KUBECONFIG"
    node = _node_under_test()
    kubectl("create", "namespace", SUITE_NS, check=False)
    kubectl("label", "node", node, f"{NODE_LABEL}=true", "--overwrite")
    helper = Helper(node)
    helper.start()
    text = bundled_node(SIM_NODE).read_text()
    helper.write_node_file(text)
    started = time.monotonic()
    kubectl("apply", "-k", str(OVERLAY))
    poll(
        lambda: any(ready(p) for p in agent_pods(node)) and allocatable(node) == {GPU: 8, NIC: 8},
        DEPLOYED_WITHIN,
        "the agent Ready, 8 GPUs and 8 NICs allocatable",
    )
    deployed = Deployment(node, helper, text)
    deployed.figures["apply -> allocatable"] = f"{time.monotonic() - started:.1f} s"
    yield deployed
    if not deployed.deleted:
        kubectl("delete", "-k", str(OVERLAY), "--wait=true", check=False, timeout=300)
    kubectl("delete", "namespace", SUITE_NS, "--wait=false", check=False)
    kubectl("label", "node", node, f"{NODE_LABEL}-", check=False)
    print("\n".join(f"figure: {k}: {v}" for k, v in deployed.figures.items()), file=sys.stderr)


@pytest.fixture(scope="session")
def pairs() -> dict[str, set[str]]:
    """GPU UUID -> interface names of the NICs paired with it, from `node-agent topo`."""
    out = subprocess.run(
        [sys.executable, "-m", "agents.cli", "topo", "--simulate", SIM_NODE, "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    topo = json.loads(out.stdout)
    uuid = {g["name"]: g["uuid"] for g in topo["gpus"]}
    netdev = {n["name"]: n["netdev"] for n in topo["nics"]}
    return {uuid[g]: {netdev[n] for n in p["nics"]} for g, p in topo["pairs"].items()}
