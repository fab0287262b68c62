"""node_agent_device_allocated on a running agent, scraped over real HTTP: each device a
container holds carries its pod's labels as the kubelet stand-in's real pod-resources
server tells them, a replica names its GPU, and a pod-resources socket that is missing,
answers garbage or hangs leaves no series and never holds a scrape up."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from prometheus_client.metrics_core import Metric

from agents.api import podresources_pb2 as pr
from agents.api import podresources_pb2_grpc as pr_grpc
from agents.backends import simulated_backends
from agents.config import Config, parse_config
from agents.core.fabric_place import LEAF_GROUP
from agents.daemon import Agent
from agents.gpu.family import GpuFamily
from agents.gpu.plan import GPU_RESOURCE
from agents.holders import SCRAPE_WAIT_S
from agents.kernel.kubelet_facts import POD_RESOURCES_TIMEOUT_S
from agents.plugin.api import DevicePlugins
from agents.roce.family import RoceFamily
from agents.sim.bundled import bundled_node
from agents.standin.kubelet import Container, Kubelet, Pod
from tests.conditions import WAIT
from tests.families import running_family
from tests.integration.test_metrics import Scrapeable
from tests.timing import SHORT

NIC_RESOURCE = "rdma/roce"
ALLOCATED = "node_agent_device_allocated"
COUNTS = {GPU_RESOURCE: 8, NIC_RESOURCE: 8}
REPLICAS = """\
version: v1
sharing:
  timeSlicing:
    resources:
      - {name: nvidia.com/gpu, replicas: 4}
"""


def held(metrics: dict[str, Metric]) -> set[tuple[str, ...]]:
    """(resource, device, physical_device, namespace, pod, container) of every sample at 1."""
    if ALLOCATED not in metrics:
        return set()
    keys = ("resource", "device", "physical_device", "namespace", "pod", "container")
    return {tuple(s.labels[k] for k in keys) for s in metrics[ALLOCATED].samples if s.value == 1}


@contextlib.asynccontextmanager
async def agent_on(
    plugin_dir: Path, node_file: Path, socket_path: Path, config: Config, kubelet: Kubelet
) -> AsyncIterator[Scrapeable]:
    """The agent (metrics on an ephemeral port, pod-resources at socket_path) registered
    with the stand-in."""
    stop = asyncio.Event()
    async with simulated_backends(node_file) as backends:
        agent = Agent(
            config,
            "<test>",
            DevicePlugins(plugin_dir),
            backends,
            metrics_address="127.0.0.1:0",
            timing=replace(SHORT, holders_poll_s=0.2),
            pod_resources_socket=socket_path,
        )
        await agent.start()
        task = asyncio.ensure_future(agent.run(stop))
        try:
            server = agent.metrics_server
            assert server is not None
            await asyncio.wait_for(server.bound.wait(), WAIT)
            await kubelet.wait_until(lambda k: _all_healthy(k.allocatable(), k.capacity()), WAIT)
            yield Scrapeable(agent, kubelet, node_file, server.port)
        finally:
            stop.set()
            await asyncio.wait_for(task, WAIT)


def _all_healthy(allocatable: dict[str, int], capacity: dict[str, int]) -> bool:
    return set(capacity) == set(COUNTS) and allocatable == capacity


@pytest.fixture
def node_file(tmp_path: Path) -> Path:
    path = tmp_path / "node.yaml"
    shutil.copy(bundled_node("h100-8gpu-8nic"), path)
    return path


@contextlib.asynccontextmanager
async def kubelet_with_pod_resources(plugin_dir: Path) -> AsyncIterator[Kubelet]:
    kubelet = Kubelet(plugin_dir, seed=5, pod_resources_socket=plugin_dir / "pr.sock")
    await kubelet.start()
    try:
        yield kubelet
    finally:
        await kubelet.stop()


async def test_each_held_device_carries_its_pod_and_container_and_goes_with_the_pod(
    plugin_dir: Path, node_file: Path
) -> None:
    async with (
        kubelet_with_pod_resources(plugin_dir) as kubelet,
        agent_on(plugin_dir, node_file, plugin_dir / "pr.sock", Config.default(), kubelet) as a,
    ):
        assert held(await a.metrics()) == set()
        pod = await kubelet.admit(
            Pod(
                "trainer",
                [Container("train", {GPU_RESOURCE: 2}), Container("net", {NIC_RESOURCE: 1})],
            )
        )
        expected = {
            (r, d, d, "default", "trainer", c)
            for c, r in (("train", GPU_RESOURCE), ("net", NIC_RESOURCE))
            for d in pod.devices(c, r)
        }
        assert len(expected) == 3
        found = await a.metrics_until(lambda m: held(m) == expected, "the trainer's 3 devices")
        assert held(found) == expected
        family = found[ALLOCATED]  # as test_metrics' conventions ask of every family
        assert family.type == "gauge" and family.documentation[0].isupper()

        await kubelet.release("trainer")
        await a.metrics_until(lambda m: held(m) == set(), "no series once the pod is deleted")


async def test_a_replica_names_the_gpu_it_is_served_from(plugin_dir: Path, node_file: Path) -> None:
    config = parse_config(REPLICAS, "<test>")
    async with (
        kubelet_with_pod_resources(plugin_dir) as kubelet,
        agent_on(plugin_dir, node_file, plugin_dir / "pr.sock", config, kubelet) as a,
    ):
        pod = await kubelet.admit(Pod("notebook", [Container("lab", {GPU_RESOURCE: 1})]))
        (replica,) = pod.devices("lab", GPU_RESOURCE)
        gpu, _, _ = replica.partition("::")
        assert gpu.startswith("GPU-") and replica != gpu
        expected = {(GPU_RESOURCE, replica, gpu, "default", "notebook", "lab")}
        await a.metrics_until(lambda m: held(m) == expected, "the replica, naming its GPU")


@contextlib.contextmanager
def garbage_socket(path: Path, answer: bytes | None) -> Iterator[None]:
    """A unix socket that answers `answer` to whoever connects and closes, or, with None,
    accepts and never answers (a hung kubelet)."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    listener.setblocking(False)
    held_open: list[socket.socket] = []

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, _ = await loop.sock_accept(listener)
            if answer is None:
                held_open.append(conn)
                continue
            with contextlib.suppress(OSError):
                await loop.sock_sendall(conn, answer)
            conn.close()

    task = asyncio.ensure_future(serve())
    try:
        yield
    finally:
        task.cancel()
        for conn in held_open:
            conn.close()
        listener.close()


@pytest.mark.parametrize(
    "answer",
    [b"missing", b"HTTP/1.1 200 OK\r\n\r\nnot grpc at all" * 50, None],
    ids=["missing", "garbage", "hung"],
)
async def test_a_pod_resources_socket_that_does_not_answer_leaves_no_series_and_no_wait(
    plugin_dir: Path, node_file: Path, kubelet: Kubelet, answer: bytes | None
) -> None:
    path = plugin_dir / "bad.sock"
    with contextlib.ExitStack() as stack:
        if answer != b"missing":
            stack.enter_context(garbage_socket(path, answer))
        async with agent_on(plugin_dir, node_file, path, Config.default(), kubelet) as a:
            await kubelet.admit(Pod("trainer", [Container("train", {GPU_RESOURCE: 2})]))
            for _ in range(3):
                began = time.monotonic()
                metrics = await a.metrics()
                took = time.monotonic() - began
                assert held(metrics) == set()
                assert "node_agent_devices" in metrics  # the rest of the exposition is there
                # The scrape waits for pod-resources at most SCRAPE_WAIT_S, never for
                # the client's own timeout (1 s).
                assert took < POD_RESOURCES_TIMEOUT_S, f"a scrape took {took:.2f}s"
            assert SCRAPE_WAIT_S < POD_RESOURCES_TIMEOUT_S
            assert a.agent.serving()


class _Lister(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """The kubelet's pod-resources List, answering `answer` (set by the test)."""

    def __init__(self) -> None:
        self.answer = pr.ListPodResourcesResponse()

    async def List(self, request: object, context: object) -> pr.ListPodResourcesResponse:
        return self.answer


@contextlib.asynccontextmanager
async def pod_resources_server(path: Path) -> AsyncIterator[_Lister]:
    lister, server = _Lister(), grpc.aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(lister, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    try:
        yield lister
    finally:
        await server.stop(0)


def claimed(driver: str, device: str) -> pr.ClaimResource:
    return pr.ClaimResource(driver_name=driver, pool_name="node-a", device_name=device)


async def test_the_devices_of_a_dra_claim_carry_the_pod_and_container_that_use_it(
    plugin_dir: Path, node_file: Path, kubelet: Kubelet
) -> None:
    path = plugin_dir / "dra-pr.sock"
    async with (
        pod_resources_server(path) as lister,
        agent_on(plugin_dir, node_file, path, Config.default(), kubelet) as a,
    ):
        gpus = running_family(a.agent, GpuFamily).facts()
        nics = running_family(a.agent, RoceFamily).facts()
        gpu, nic = gpus.devices[3], nics.devices[1]
        train = [claimed(gpus.driver, gpu.name), claimed("other.example.com", gpu.name)]
        train.append(claimed(gpus.driver, "gpu-99"))  # not a device of this node
        lister.answer = pr.ListPodResourcesResponse(
            pod_resources=[
                pr.PodResources(
                    name="trainer",
                    namespace="ml",
                    containers=[
                        _claiming("train", "gpus", train),
                        _claiming("net", "nic", [claimed(nics.driver, nic.name)]),
                    ],
                )
            ]
        )
        expected = {
            (gpu.resource, gpu.device_id, gpu.device_id, "ml", "trainer", "train"),
            (nic.resource, nic.device_id, nic.device_id, "ml", "trainer", "net"),
        }
        assert gpu.resource == GPU_RESOURCE and nic.resource == NIC_RESOURCE
        await a.metrics_until(lambda m: held(m) == expected, "the claims' devices")


def _claiming(container: str, claim: str, devices: list[pr.ClaimResource]) -> pr.ContainerResources:
    dynamic = pr.DynamicResource(claim_name=claim, claim_namespace="ml", claim_resources=devices)
    return pr.ContainerResources(name=container, dynamic_resources=[dynamic])


async def test_the_node_labels_the_agent_writes_are_a_metric_the_leaf_group_among_them(
    plugin_dir: Path, node_file: Path, kubelet: Kubelet
) -> None:
    async with agent_on(
        plugin_dir, node_file, plugin_dir / "none.sock", Config.default(), kubelet
    ) as a:

        def leaf_group(metrics: dict[str, Metric]) -> set[str]:
            family = metrics.get("node_agent_node_label")
            samples = [] if family is None else family.samples
            return {s.labels["value"] for s in samples if s.labels["name"] == LEAF_GROUP}

        found = await a.metrics_until(lambda m: bool(leaf_group(m)), "the leaf-group label")
        assert leaf_group(found) == {a.agent.labels()[LEAF_GROUP]}
