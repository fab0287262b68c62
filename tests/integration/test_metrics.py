"""The metrics endpoint of a running agent, scraped over real HTTP: device counts by
health, registrations, allocations and RPC latency, health events after an injected XID,
/healthz, and an HTTP server that answers bad requests without falling over."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from email.message import Message
from pathlib import Path

import pytest
import yaml
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from agents.backends import simulated_backends
from agents.config import Config
from agents.core.health import DeviceHealth, Signal
from agents.daemon import Agent
from agents.errors import ConfigError
from agents.gpu.family import GpuFamily
from agents.gpu.plan import GPU_RESOURCE
from agents.metrics import Metrics, MetricsServer
from agents.plugin.api import DevicePlugins
from agents.sim.bundled import bundled_node
from agents.standin.kubelet import Container, Kubelet, Pod
from tests.conditions import WAIT
from tests.families import running_family

NIC_RESOURCE = "rdma/roce"
COUNTS = {GPU_RESOURCE: 8, NIC_RESOURCE: 8}
SUFFIXES = ("", "_total", "_count", "_sum", "_bucket", "_created")  # sample name -> family


@dataclass
class Reply:
    status: int
    headers: Message
    body: bytes


@dataclass
class Scrapeable:
    agent: Agent
    kubelet: Kubelet
    node_file: Path
    port: int

    async def get(self, path: str, method: str = "GET") -> Reply:
        """One request through urllib, a real HTTP client, run in a thread."""
        url = f"http://127.0.0.1:{self.port}{path}"
        return await asyncio.to_thread(_request, url, method)

    async def metrics(self) -> dict[str, Metric]:
        reply = await self.get("/metrics")
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return {m.name: m for m in text_string_to_metric_families(reply.body.decode())}

    async def metrics_until(
        self, ready: Callable[[dict[str, Metric]], bool], what: str
    ) -> dict[str, Metric]:
        """Scrape until `ready` holds for the exposition; fail after WAIT seconds."""
        deadline = time.monotonic() + WAIT
        while not ready(found := await self.metrics()):
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {WAIT}s waiting for {what}")
            await asyncio.sleep(0.01)
        return found

    async def raw(self, data: bytes) -> bytes:
        """Send raw bytes, half-close, and read whatever comes back until EOF."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            # The server may close (even reset) the connection before reading all of
            # an oversized request; that is an answer too: nothing.
            with contextlib.suppress(ConnectionError):
                writer.write(data)
                await writer.drain()
                writer.write_eof()
            try:
                return await asyncio.wait_for(reader.read(), WAIT)
            except ConnectionResetError:
                return b""
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def inject_xid(self, gpu: int, xid: int) -> None:
        """Edit the node file with an atomic rename, as an operator would."""
        doc = yaml.safe_load(self.node_file.read_text())
        doc["gpus"][gpu]["xids"].append(xid)
        tmp = self.node_file.with_name(".node.yaml.tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        tmp.replace(self.node_file)


def _request(url: str, method: str) -> Reply:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=WAIT) as r:
            return Reply(r.status, r.headers, r.read())
    except urllib.error.HTTPError as err:
        return Reply(err.code, err.headers, err.read())


def value(metrics: Mapping[str, Metric], sample: str, **labels: str) -> float | None:
    """The value of the sample named `sample` with exactly these labels; None if absent."""
    family = next(
        (sample.removesuffix(x) for x in SUFFIXES if sample.removesuffix(x) in metrics), None
    )
    found = (
        []
        if family is None
        else [s.value for s in metrics[family].samples if s.name == sample and s.labels == labels]
    )
    assert len(found) <= 1, f"{sample}{labels} appears {len(found)} times"
    return found[0] if found else None


def health(kubelet: Kubelet, gpu: str) -> str | None:
    view = kubelet.resource(GPU_RESOURCE)
    state = view.devices.get(gpu) if view is not None else None
    return state.health if state is not None else None


@pytest.fixture
async def running(tmp_path: Path, plugin_dir: Path) -> AsyncIterator[Scrapeable]:
    """The agent (every family, metrics on an ephemeral port) registered with the stand-in."""
    node_file = tmp_path / "node" / "node.yaml"
    node_file.parent.mkdir()
    shutil.copy(bundled_node("h100-8gpu-8nic"), node_file)
    kubelet = Kubelet(plugin_dir, seed=3)
    await kubelet.start()
    stop = asyncio.Event()
    try:
        async with simulated_backends(node_file) as backends:
            agent = Agent(
                Config.default(),
                "<defaults>",
                DevicePlugins(plugin_dir),
                backends,
                metrics_address="127.0.0.1:0",
            )
            await agent.start()
            task = asyncio.ensure_future(agent.run(stop))
            try:
                server = agent.metrics_server
                assert server is not None
                await asyncio.wait_for(server.bound.wait(), WAIT)
                await kubelet.wait_until(lambda k: k.capacity() == COUNTS, WAIT)
                yield Scrapeable(agent, kubelet, node_file, server.port)
            finally:
                stop.set()
                await asyncio.wait_for(task, WAIT)
    finally:
        await kubelet.stop()


async def test_devices_are_counted_by_resource_and_health(running: Scrapeable) -> None:
    metrics = await running.metrics()
    for resource in COUNTS:
        assert value(metrics, "node_agent_devices", resource=resource, health="Healthy") == 8
        assert value(metrics, "node_agent_devices", resource=resource, health="Unhealthy") == 0


async def test_each_resource_counts_its_registration(running: Scrapeable) -> None:
    def registered(metrics: dict[str, Metric]) -> bool:
        return all(
            value(metrics, "node_agent_registrations_total", resource=r) == 1 for r in COUNTS
        )

    await running.metrics_until(registered, "one registration per resource")


async def test_admission_moves_allocation_counters_and_rpc_latency(running: Scrapeable) -> None:
    before = await running.metrics()
    assert "node_agent_allocations" not in before or not before["node_agent_allocations"].samples

    await running.kubelet.admit(
        Pod("trainer", [Container("train", {GPU_RESOURCE: 2, NIC_RESOURCE: 2})])
    )

    metrics = await running.metrics()
    for resource in COUNTS:
        assert value(metrics, "node_agent_allocations_total", resource=resource) == 1
        assert value(metrics, "node_agent_allocated_devices_total", resource=resource) == 2
        for method in ("GetPreferredAllocation", "Allocate"):
            labels = {"resource": resource, "method": method, "code": "OK"}
            assert value(metrics, "node_agent_rpc_duration_seconds_count", **labels) == 1
            assert value(metrics, "node_agent_rpc_duration_seconds_bucket", le="+Inf", **labels)
            assert (value(metrics, "node_agent_rpc_duration_seconds_sum", **labels) or 0) > 0


async def test_injected_xid_79_turns_one_gpu_unhealthy_and_counts_the_event(
    running: Scrapeable,
) -> None:
    victim = running_family(running.agent, GpuFamily).gpus[3].uuid
    await running.inject_xid(3, 79)
    await running.kubelet.wait_until(lambda k: health(k, victim) == "Unhealthy", WAIT)

    metrics = await running.metrics()
    assert value(metrics, "node_agent_devices", resource=GPU_RESOURCE, health="Unhealthy") == 1
    assert value(metrics, "node_agent_devices", resource=GPU_RESOURCE, health="Healthy") == 7
    assert value(metrics, "node_agent_devices", resource=NIC_RESOURCE, health="Unhealthy") == 0
    events = {"resource": GPU_RESOURCE, "reason": "xid=79"}
    assert value(metrics, "node_agent_health_events_total", **events) == 1


async def test_every_xid_is_counted_by_gpu_and_xid_also_those_that_change_no_health(
    running: Scrapeable,
) -> None:
    gpus = running_family(running.agent, GpuFamily).gpus
    victim, bystander = gpus[3].uuid, gpus[5].uuid
    await running.inject_xid(3, 79)
    await running.kubelet.wait_until(lambda k: health(k, victim) == "Unhealthy", WAIT)
    await running.inject_xid(3, 79)  # again, on a GPU already Unhealthy for it
    await running.inject_xid(5, 13)  # an application's XID: the GPU stays Healthy

    def xids(gpu: str, xid: int, metrics: Mapping[str, Metric]) -> float | None:
        labels = {"resource": GPU_RESOURCE, "device": gpu, "xid": str(xid)}
        return value(metrics, "node_agent_gpu_xid_errors_total", **labels)

    metrics = await running.metrics_until(
        lambda m: xids(victim, 79, m) == 2 and xids(bystander, 13, m) == 1, "every XID counted"
    )
    assert xids(victim, 13, metrics) is None and xids(bystander, 79, metrics) is None
    # The XID alert counts a series created within its hour whole, by this sample.
    created = {"resource": GPU_RESOURCE, "device": victim, "xid": "79"}
    assert (value(metrics, "node_agent_gpu_xid_errors_created", **created) or 0) > 0
    assert health(running.kubelet, bystander) == "Healthy"
    events = {"resource": GPU_RESOURCE, "reason": "xid=79"}
    assert value(metrics, "node_agent_health_events_total", **events) == 1


async def test_a_degraded_gpu_published_by_the_agent_is_scraped_with_its_figures(
    running: Scrapeable,
) -> None:
    victim = running_family(running.agent, GpuFamily).gpus[2].uuid
    x8 = Signal("pcie-width", "PCIe link x8 of x16", (("width", 8), ("maxWidth", 16)))
    running.agent.health.publish([DeviceHealth(GPU_RESOURCE, victim, "GPU 2", x8)])
    running.agent.health.readings(GPU_RESOURCE, victim, {"gpu_pcie_link_width": 8})
    series = {"resource": GPU_RESOURCE, "device": victim, "signal": "pcie-width"}
    metrics = await running.metrics()
    assert value(metrics, "node_agent_device_degraded", **series) == 1
    assert value(metrics, "node_agent_device_signal_figure", **series, figure="width") == 8
    reading = {"resource": GPU_RESOURCE, "device": victim}
    assert value(metrics, "node_agent_gpu_pcie_link_width", **reading) == 8
    events = {"resource": GPU_RESOURCE, "reason": "pcie-width"}
    assert value(metrics, "node_agent_health_events_total", **events) == 1

    running.agent.health.publish([DeviceHealth(GPU_RESOURCE, victim, "GPU 2")])
    metrics = await running.metrics()
    assert value(metrics, "node_agent_device_degraded", **series) == 0
    assert value(metrics, "node_agent_device_signal_figure", **series, figure="width") is None


async def test_the_gpu_family_feeds_the_readings_of_each_gpu_to_the_gauges(
    running: Scrapeable,
) -> None:
    """The GPU family's own signal probes reach the always-on gauges: every GPU's link at
    rest, then one GPU's link narrowed in the node file, with the signal it makes."""
    gpus = [g.uuid for g in running_family(running.agent, GpuFamily).gpus]

    def reading(metrics: Mapping[str, Metric], name: str, uuid: str) -> float | None:
        return value(metrics, name, resource=GPU_RESOURCE, device=uuid)

    metrics = await running.metrics_until(
        lambda m: all(reading(m, "node_agent_gpu_pcie_link_width", u) == 16 for u in gpus),
        "every GPU's PCIe link width",
    )
    for uuid in gpus:
        assert reading(metrics, "node_agent_gpu_pcie_link_width_max", uuid) == 16
        assert reading(metrics, "node_agent_gpu_pcie_link_gen", uuid) == 5
        assert reading(metrics, "node_agent_gpu_hw_slowdown", uuid) == 0
        assert reading(metrics, "node_agent_gpu_row_remap_pending", uuid) == 0

    doc = yaml.safe_load(running.node_file.read_text())
    doc["gpus"][2]["pcie"] = {"width": 8, "maxWidth": 16}
    tmp = running.node_file.with_name(".node.yaml.tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.replace(running.node_file)
    narrow = gpus[2]
    series = {"resource": GPU_RESOURCE, "device": narrow, "signal": "pcie-width"}
    metrics = await running.metrics_until(  # within a signal period (5 s) and a scrape
        lambda m: (
            reading(m, "node_agent_gpu_pcie_link_width", narrow) == 8
            and value(m, "node_agent_device_degraded", **series) == 1
        ),
        "GPU 2's narrowed link",
    )
    assert reading(metrics, "node_agent_gpu_pcie_link_width_max", narrow) == 16
    assert reading(metrics, "node_agent_gpu_pcie_link_width", gpus[0]) == 16


async def test_metric_names_and_help_follow_prometheus_conventions(running: Scrapeable) -> None:
    await running.kubelet.admit(Pod("one", [Container("c", {GPU_RESOURCE: 1})]))
    metrics = await running.metrics()
    expected = {
        "node_agent_devices": "gauge",
        "node_agent_build_info": "gauge",
        "node_agent_registrations": "counter",
        "node_agent_allocations": "counter",
        "node_agent_allocated_devices": "counter",
        "node_agent_health_events": "counter",
        "node_agent_rpc_duration_seconds": "histogram",
        "node_agent_device_degraded": "gauge",
        "node_agent_device_signal_figure": "gauge",
        "node_agent_gpu_pcie_link_width": "gauge",
    }
    assert {name: metrics[name].type for name in expected if name in metrics} == expected
    for name, family in metrics.items():
        assert name.startswith("node_agent_"), name
        assert family.documentation and family.documentation[0].isupper(), name
        if family.type == "counter":
            # prometheus_client exposes the samples of counters with the _total suffix.
            assert {s.name for s in family.samples} <= {f"{name}_total", f"{name}_created"}
    build = metrics["node_agent_build_info"].samples
    assert [s.value for s in build] == [1.0]


async def test_healthz_answers_200_while_serving(running: Scrapeable) -> None:
    reply = await running.get("/healthz")
    assert (reply.status, reply.body) == (200, b"ok\n")


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("GET", "/nothing-here", 404),
        ("GET", "/", 404),
        ("POST", "/metrics", 405),
        ("DELETE", "/healthz", 405),
    ],
    ids=["unknown-path", "root", "post-metrics", "delete-healthz"],
)
async def test_other_requests_get_an_http_error(
    running: Scrapeable, method: str, path: str, status: int
) -> None:
    reply = await running.get(path, method)
    assert reply.status == status
    if status == 405:
        assert reply.headers["Allow"] == "GET"


@pytest.mark.parametrize(
    ("data", "answer"),
    [
        (b"\x00\xff\xfe garbage\r\n\r\n", b"HTTP/1.1 400 Bad Request\r\n"),
        (b"GET /metrics\r\n\r\n", b"HTTP/1.1 400 Bad Request\r\n"),
        (b"GET /metrics HTTP/1.1\r\nHost: x", b""),  # head never completed
        (b"", b""),  # connected and closed
        (b"A" * 100_000, b""),  # a head longer than the server reads
    ],
    ids=["binary", "no-version", "incomplete", "empty", "oversized"],
)
async def test_bad_requests_do_not_stop_the_server(
    running: Scrapeable, data: bytes, answer: bytes
) -> None:
    reply = await running.raw(data)
    assert reply.startswith(answer)
    assert bool(reply) == bool(answer)
    assert (await running.get("/healthz")).status == 200


def test_metrics_address_must_be_host_and_port() -> None:
    for bad in ("17400", "localhost", "0.0.0.0:http", "0.0.0.0:70000"):
        with pytest.raises(ConfigError, match="--metrics-address"):
            MetricsServer(Metrics(), bad, lambda: True)
