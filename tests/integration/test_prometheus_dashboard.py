"""A real Prometheus (Debian's binary) scrapes an agent on a simulated node with pods
holding devices: every query of the chart's dashboard returns series through its HTTP
API, the pod labels are those of the pods that hold the devices, and the chart's rules
load."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import time
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.backends import simulated_backends
from agents.config import Config
from agents.daemon import Agent
from agents.gpu.plan import GPU_RESOURCE
from agents.plugin.api import DevicePlugins
from agents.sim.bundled import bundled_node
from agents.standin.kubelet import Container, Kubelet, Pod
from tests.conditions import PROCESS_WAIT, WAIT
from tests.timing import SHORT

NIC_RESOURCE = "rdma/roce"
CHART_FILES = Path(__file__).resolve().parents[2] / "daemonset" / "chart" / "node-agents" / "files"
SCRAPE_S = 0.5
SCRAPE = "500ms"  # SCRAPE_S as Prometheus writes a duration


def prometheus_binary() -> str:
    found = shutil.which("prometheus")
    if found is None:
        why = "prometheus is not installed: hack/prereqs installs Debian's prometheus"
        if os.environ.get("CI") == "true":
            pytest.fail(why)
        pytest.skip(why)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Prometheus:
    port: int

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"http://127.0.0.1:{self.port}{path}{query}"
        with urllib.request.urlopen(url, timeout=WAIT) as reply:
            return json.loads(reply.read())

    async def query(self, expr: str) -> list[dict[str, Any]]:
        answer = await asyncio.to_thread(self.get, "/api/v1/query", query=expr)
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    async def until(self, expr: str, holds: Any, what: str) -> list[dict[str, Any]]:
        deadline = time.monotonic() + PROCESS_WAIT
        while not holds(found := await self.query(expr)):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}: {expr} gave {found}")
            await asyncio.sleep(SCRAPE_S / 2)
        return found


@contextlib.asynccontextmanager
async def prometheus(tmp_path: Path, target_port: int) -> AsyncIterator[Prometheus]:
    """Prometheus on 127.0.0.1, scraping the agent every SCRAPE_S, with the chart's rules."""
    binary = prometheus_binary()
    shutil.copy(CHART_FILES / "prometheus-rules.yaml", tmp_path / "rules.yaml")
    config = {
        "global": {"scrape_interval": SCRAPE, "evaluation_interval": SCRAPE},
        "rule_files": ["rules.yaml"],
        "scrape_configs": [
            {
                "job_name": "node-agent",
                "static_configs": [{"targets": [f"127.0.0.1:{target_port}"]}],
            }
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    with (tmp_path / "prometheus.log").open("w") as log:
        process = await asyncio.create_subprocess_exec(
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=log,
        )
    try:
        server = Prometheus(port)
        deadline = time.monotonic() + PROCESS_WAIT
        while True:
            assert process.returncode is None, (tmp_path / "prometheus.log").read_text()
            with contextlib.suppress(OSError):
                await asyncio.to_thread(server.get, "/api/v1/status/runtimeinfo")
                break
            if time.monotonic() > deadline:
                raise AssertionError("prometheus did not answer in time")
            await asyncio.sleep(0.1)
        yield server
    finally:
        if process.returncode is None:
            process.terminate()
        await asyncio.wait_for(process.wait(), WAIT)


def panel_queries() -> dict[str, str]:
    """Each panel's query, as Grafana sends it with every node chosen."""
    dashboard = json.loads((CHART_FILES / "dashboard.json").read_text())
    return {
        panel["title"]: target["expr"].replace("$instance", ".*")
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    }


@pytest.fixture
def node_file(tmp_path: Path) -> Path:
    """The bundled 8-GPU, 8-NIC node, its first GPU on a PCIe link of x8 (Degraded), its
    NICs with a link speed (sysfs' speed file) as a real node's have."""
    doc = yaml.safe_load(bundled_node("h100-8gpu-8nic").read_text())
    doc["gpus"][0]["pcie"] = {"width": 8}
    for nic in doc["nics"]:
        nic["speedMbps"] = 400000
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


async def test_every_dashboard_query_returns_series_and_pods_hold_what_the_kubelet_gave(
    tmp_path: Path, plugin_dir: Path, node_file: Path
) -> None:
    kubelet = Kubelet(plugin_dir, seed=11, pod_resources_socket=plugin_dir / "pr.sock")
    await kubelet.start()
    stop = asyncio.Event()
    try:
        async with simulated_backends(node_file) as backends:
            agent = Agent(
                Config.default(),
                "<test>",
                DevicePlugins(plugin_dir),
                backends,
                metrics_address="127.0.0.1:0",
                timing=replace(SHORT, holders_poll_s=0.2),
                pod_resources_socket=plugin_dir / "pr.sock",
            )
            await agent.start()
            task = asyncio.ensure_future(agent.run(stop))
            try:
                assert agent.metrics_server is not None
                await asyncio.wait_for(agent.metrics_server.bound.wait(), WAIT)
                await kubelet.wait_until(
                    lambda k: set(k.capacity()) == {GPU_RESOURCE, NIC_RESOURCE}, WAIT
                )
                async with prometheus(tmp_path, agent.metrics_server.port) as server:
                    await _check(server, kubelet)
            finally:
                stop.set()
                await asyncio.wait_for(task, WAIT)
    finally:
        await kubelet.stop()


async def _check(server: Prometheus, kubelet: Kubelet) -> None:
    trainer = await kubelet.admit(
        Pod("trainer", [Container("train", {GPU_RESOURCE: 2}), Container("net", {NIC_RESOURCE: 2})])
    )
    notebook = await kubelet.admit(Pod("notebook", [Container("lab", {GPU_RESOURCE: 1})]))
    expected = {
        (pod.pod, container, device)
        for pod in (trainer, notebook)
        for container, held in pod.containers.items()
        for devices in held.devices.values()
        for device in devices
    }
    assert len(expected) == 5

    def pods(found: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
        return {
            (s["metric"]["pod"], s["metric"]["container"], s["metric"]["device"]) for s in found
        }

    found = await server.until(
        "node_agent_device_allocated", lambda f: pods(f) == expected, "the pods' devices"
    )
    assert {s["metric"]["namespace"] for s in found} == {"default"}
    for title, expr in panel_queries().items():
        await server.until(expr, bool, f"panel {title!r} to have series")
    by_pod = await server.query(panel_queries()["GPU utilization by pod"])
    assert {s["metric"]["pod"] for s in by_pod} == {"trainer", "notebook"}
    rules = await asyncio.to_thread(server.get, "/api/v1/rules")
    loaded = [r for g in rules["data"]["groups"] for r in g["rules"]]
    chart = yaml.safe_load((CHART_FILES / "prometheus-rules.yaml").read_text())
    alerts = {r["alert"] for g in chart["groups"] for r in g["rules"]}
    assert {r["name"] for r in loaded} == alerts and len(alerts) >= 7  # every alert loaded
    assert all(r["health"] != "err" for r in loaded)
