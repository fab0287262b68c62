"""Device faults of a simulated node reach the API-server stand-in as Events and the
`DevicesHealthy` condition, while the kubelet hears of them as fast with the API server
reachable, refusing or never answering."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.cluster.client import Access, ApiClient
from agents.cluster.reporter import Reporter
from agents.daemon import Agent
from agents.sim.bundled import bundled_node
from agents.standin.kubelet import Kubelet
from tests.conditions import WAIT, async_wait_until
from tests.integration.gpu_agent import Running, running_agent
from tests.standin.apiserver import HANG, REFUSE, UP, ApiServer
from tests.writers import write_atomic

NODE = "gpu-node-7"
GPU = "nvidia.com/gpu"
KUBELET_WITHIN_S = 1.0  # a fault reaches the kubelet within this, API server or not
EVENT_WITHIN_S = 2.0  # and the Event follows the kubelet's view within this


@dataclass
class Node:
    run: Running
    server: ApiServer

    @property
    def agent(self) -> Agent:
        return self.run.agent

    @property
    def kubelet(self) -> Kubelet:
        return self.run.kubelet

    def edit(self, gpu: int, **fields: Any) -> None:
        doc = yaml.safe_load(self.run.node_file.read_text())
        doc["gpus"][gpu].update(fields)
        write_atomic(self.run.node_file, yaml.safe_dump(doc, sort_keys=False))

    def uuid(self, gpu: int) -> str:
        return str(yaml.safe_load(self.run.node_file.read_text())["gpus"][gpu]["uuid"])

    def health(self, device: str, resource: str = GPU) -> str | None:
        return self.run.devices(resource).get(device)

    def condition(self) -> dict[str, str]:
        return self.server.store.condition(NODE, "DevicesHealthy") or {}

    def events(self, reason: str) -> list[dict[str, Any]]:
        items = self.server.store.event_list("default")["items"]
        return [e for e in items if e["reason"] == reason]


@contextlib.asynccontextmanager
async def running(
    tmp_path: Path, node: str = "h100-8gpu-8nic", config: str = "", **gpu0: Any
) -> AsyncIterator[Node]:
    source = tmp_path / "source.yaml"
    doc = yaml.safe_load(bundled_node(node).read_text())
    doc["gpus"][0].update(gpu0)
    source.write_text(yaml.safe_dump(doc, sort_keys=False))
    server = ApiServer((NODE,))
    await server.start()
    reporter = Reporter(NODE, ApiClient(Access(server.url), timeout_s=0.5), max_retry_s=0.5)
    try:
        async with running_agent(tmp_path, config, node=source, reporter=reporter) as run:
            yield Node(run, server)
    finally:
        await server.stop()


async def test_xid79_then_reset_tell_the_cluster_why(tmp_path: Path) -> None:
    async with running(tmp_path) as node:
        victim = node.uuid(5)
        await async_wait_until(lambda: node.condition().get("status") == "True", WAIT)
        await node.run.sim.watching.wait()
        node.edit(5, xids=[79])
        await node.kubelet.wait_until(lambda _: node.health(victim) == "Unhealthy", WAIT)
        seen = time.monotonic()
        await async_wait_until(lambda: node.events("DeviceUnhealthy") != [], WAIT)
        event_s = time.monotonic() - seen
        [event] = node.events("DeviceUnhealthy")
        assert event["type"] == "Warning"
        assert (
            event["message"]
            == f"{GPU} device {victim} (GPU 5) is Unhealthy: XID 79 (fell off the bus)"
        )
        assert event["involvedObject"]["name"] == NODE
        await async_wait_until(lambda: node.condition().get("status") == "False", WAIT)
        assert f"{victim} (GPU 5): XID 79 (fell off the bus)" in node.condition()["message"]
        # A reset: the GPU leaves the bus, then answers again.
        node.edit(5, xids=[], lost=True)
        await async_wait_until(
            lambda: "NVML: GPU is lost" in str(node.events("DeviceUnhealthy")), WAIT
        )
        node.edit(5, lost=False)
        await node.kubelet.wait_until(lambda _: node.health(victim) == "Healthy", WAIT)
        await async_wait_until(lambda: node.events("DeviceHealthy") != [], WAIT)
        [healed] = node.events("DeviceHealthy")
        assert (
            healed["type"] == "Normal" and f"{victim} (GPU 5) is Healthy again" in healed["message"]
        )
        await async_wait_until(lambda: node.condition().get("status") == "True", WAIT)
    print(f"\nkubelet Unhealthy -> Warning Event {event_s * 1000:.0f} ms")
    assert event_s < EVENT_WITHIN_S


async def test_a_gpu_failing_before_start_is_in_the_first_condition(tmp_path: Path) -> None:
    # A GPU whose NVML answers fail from the start is listed, and Unhealthy. (One already
    # off the bus cannot be listed at all: NVML gives no handle for it.)
    async with running(tmp_path, nvml={"error": "Unknown"}) as node:
        victim = node.uuid(0)
        await async_wait_until(lambda: node.condition().get("status") == "False", WAIT)
        assert f"{victim} (GPU 0): NVML: Unknown" in node.condition()["message"]
        assert node.condition()["message"].startswith("1 of 8 devices Unhealthy")
        # Never True for a moment: the first condition already knew of the failing GPU.
        assert node.server.store.condition_history(NODE, "DevicesHealthy")[0] == "False"


async def test_replicas_report_their_gpu_once(tmp_path: Path) -> None:
    sharing = (
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
        "    - name: nvidia.com/gpu\n      replicas: 4\n"
    )
    async with running(tmp_path, config=sharing) as node:
        victim = node.uuid(2)
        await async_wait_until(lambda: node.condition().get("status") == "True", WAIT)
        await node.run.sim.watching.wait()
        node.edit(2, xids=[48])
        await async_wait_until(lambda: node.events("DeviceUnhealthy") != [], WAIT)
        [event] = node.events("DeviceUnhealthy")
        assert (
            f"device {victim} (GPU 2) is Unhealthy: XID 48 (uncorrectable ECC)" in event["message"]
        )
        await async_wait_until(lambda: node.condition().get("status") == "False", WAIT)
        assert node.condition()["message"].startswith("1 of 8 devices Unhealthy")


async def test_mig_instances_each_get_an_event(tmp_path: Path) -> None:
    mixed = "version: v1\nflags:\n  migStrategy: mixed\n"
    async with running(tmp_path, node="mig-mixed", config=mixed) as node:
        await async_wait_until(lambda: node.condition().get("status") == "True", WAIT)
        doc = yaml.safe_load(node.run.node_file.read_text())
        mig_gpu = next(i for i, g in enumerate(doc["gpus"]) if g.get("mig", {}).get("enabled"))
        instances = [m["uuid"] for m in doc["gpus"][mig_gpu]["mig"]["instances"]]
        await node.run.sim.watching.wait()
        node.edit(mig_gpu, xids=[79])
        await async_wait_until(lambda: len(node.events("DeviceUnhealthy")) == len(instances), WAIT)
        messages = " ".join(e["message"] for e in node.events("DeviceUnhealthy"))
        assert all(f"{m} (MIG {mig_gpu}:" in messages for m in instances)


@pytest.mark.parametrize("outage", [REFUSE, HANG])
async def test_an_absent_api_server_delays_no_health_update(tmp_path: Path, outage: str) -> None:
    async with running(tmp_path) as node:
        victim = node.uuid(3)
        await async_wait_until(lambda: node.condition().get("status") == "True", WAIT)
        await node.server.set_mode(outage)
        await node.run.sim.watching.wait()
        started = time.monotonic()
        node.edit(3, xids=[79])
        await node.kubelet.wait_until(lambda _: node.health(victim) == "Unhealthy", WAIT)
        kubelet_s = time.monotonic() - started
        await async_wait_until(lambda: node.agent.reporter.reachable is False, WAIT)  # type: ignore[union-attr]
        assert node.events("DeviceUnhealthy") == []
        await node.server.set_mode(UP)
        await async_wait_until(lambda: node.condition().get("status") == "False", WAIT)
        await async_wait_until(lambda: len(node.events("DeviceUnhealthy")) == 1, WAIT)
    print(f"\nAPI server {outage}: XID -> kubelet Unhealthy {kubelet_s * 1000:.0f} ms")
    assert kubelet_s < KUBELET_WITHIN_S + 1.0  # the node file is re-read within 1 s
