"""An agent that says what it waits for and serves its device plugins whatever else fails:
a missing kubelet.sock is logged (at start and again while it stays missing), a metrics
port that is taken or a label file that cannot be written is logged and the resources
are registered anyway, and a family without devices registers nothing until it has some."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.processors import TimeStamper
from structlog.testing import LogCapture

from agents.backends import simulated_backends
from agents.config import Config
from agents.daemon import Agent
from agents.kernel.catalogue import Inventory
from agents.plugin.api import DevicePlugins
from agents.plugin.manager import WAITING_LOG_S, PluginManager
from agents.standin.kubelet import Kubelet
from agents.tasks import until
from tests.conditions import WAIT, async_wait_until
from tests.integration.test_agent_lifecycle import GPU, NIC, listed

EditNode = Callable[..., None]


@contextlib.contextmanager
def logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """The agent's log events while the block runs, each stamped (`at`) as it was logged."""
    capture = LogCapture()
    before = structlog.get_config()["processors"]
    structlog.configure(processors=[TimeStamper(fmt=None, key="at"), capture])
    try:
        yield capture.entries
    finally:
        structlog.configure(processors=before)


def events(captured: Sequence[Mapping[str, Any]], name: str) -> list[Mapping[str, Any]]:
    return [e for e in captured if e["event"] == name]


@contextlib.asynccontextmanager
async def agent_on(node_file: Path, plugin_dir: Path, **options: Any) -> AsyncIterator[Agent]:
    async with simulated_backends(node_file) as backends:
        agent = Agent(Config.default(), "<test>", DevicePlugins(plugin_dir), backends, **options)
        await agent.start()
        stop = asyncio.Event()
        task = asyncio.ensure_future(agent.run(stop))
        try:
            assert backends.simulated is not None
            await asyncio.wait_for(backends.simulated.watching.wait(), WAIT)
            yield agent
        finally:
            stop.set()
            await asyncio.wait_for(task, WAIT)
        assert task.exception() is None


# Waiting for the kubelet


async def test_missing_kubelet_socket_is_logged_at_start_naming_the_socket(
    node_file: Path, plugin_dir: Path
) -> None:
    with logs() as captured:
        async with agent_on(node_file, plugin_dir) as agent:
            await async_wait_until(
                lambda: events(captured, "waiting_for_kubelet"), WAIT, "waiting logged"
            )
            assert agent.serving()
    first = events(captured, "waiting_for_kubelet")[0]
    assert first["socket"] == str(plugin_dir / "kubelet.sock")
    assert WAITING_LOG_S == 30.0


class _Listed:
    """A resource with devices to list (the runtime needs nothing more of a family here)."""

    def __init__(self, name: str, devices: int) -> None:
        from agents.core.device import Device

        self.name = name
        self.inventory = Inventory(Device(f"d{i}") for i in range(devices))

    def physical_id(self, device_id: str) -> str:
        return device_id

    def allocate(self, device_ids: Any) -> Any:
        raise NotImplementedError

    def preferred(self, available: Any, must_include: Any, size: int) -> list[str]:
        return []


async def test_missing_kubelet_socket_is_logged_again_each_interval_until_it_appears(
    plugin_dir: Path,
) -> None:
    interval = 0.3
    manager = PluginManager(plugin_dir, [_Listed("example.com/dev", 2)], waiting_log_s=interval)
    stop = asyncio.Event()
    with logs() as captured:
        task = asyncio.ensure_future(until(stop, manager.run))
        try:
            await async_wait_until(lambda: len(events(captured, "waiting_for_kubelet")) >= 3, WAIT)
            kubelet = Kubelet(plugin_dir, seed=1)
            await kubelet.start()
            try:
                await kubelet.wait_until(listed("example.com/dev", 2), WAIT)
            finally:
                await kubelet.stop()
        finally:
            stop.set()
            await asyncio.wait_for(task, WAIT)
    seen = [e["at"] for e in events(captured, "waiting_for_kubelet")][:3]
    gaps = [b - a for a, b in itertools.pairwise(seen)]
    assert all(gap >= interval - 0.05 for gap in gaps), gaps
    socket_path = str(plugin_dir / "kubelet.sock")
    assert all(e["socket"] == socket_path for e in events(captured, "waiting_for_kubelet"))


# Metrics and labels are optional


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


async def test_taken_metrics_port_is_logged_and_the_plugins_keep_serving(
    node_file: Path, plugin_dir: Path, kubelet: Kubelet, taken_port: int
) -> None:
    address = f"127.0.0.1:{taken_port}"
    with logs() as captured:
        async with agent_on(node_file, plugin_dir, metrics_address=address) as agent:
            await kubelet.wait_until(lambda k: listed(GPU, 8)(k) and listed(NIC, 8)(k), WAIT)
            await async_wait_until(lambda: events(captured, "metrics_unavailable"), WAIT)
            assert agent.serving()
    (unavailable,) = events(captured, "metrics_unavailable")
    assert unavailable["address"] == address


async def test_unwritable_label_file_is_logged_once_and_written_once_it_can_be(
    node_file: Path, plugin_dir: Path, kubelet: Kubelet, tmp_path: Path, edit_node: EditNode
) -> None:
    blocker = tmp_path / "features.d"
    blocker.write_text("a file where the directory should be")
    features = blocker / "node-agents"
    with logs() as captured:
        async with agent_on(node_file, plugin_dir, nfd_features_file=features):
            await kubelet.wait_until(lambda k: listed(GPU, 8)(k) and listed(NIC, 8)(k), WAIT)
            await async_wait_until(lambda: events(captured, "node_labels_unwritable"), WAIT)

            blocker.unlink()
            edit_node(lambda d: d["nics"][0].__setitem__("link", "down"))  # a change
            await async_wait_until(
                lambda: features.exists() and "roce.healthy=7" in features.read_text(),
                WAIT,
                "labels written after all",
            )
            await kubelet.wait_until(listed(NIC, 8, healthy=7), WAIT)
    assert len(events(captured, "node_labels_unwritable")) == 1


# No empty resource


async def test_family_without_devices_registers_nothing_until_it_has_some(
    node_file: Path,
    plugin_dir: Path,
    node_doc: dict[str, Any],
    edit_node: EditNode,
    kubelet: Kubelet,
) -> None:
    nics = node_doc["nics"]
    edit_node(lambda d: d.__setitem__("nics", []))
    with logs() as captured:
        async with agent_on(node_file, plugin_dir) as agent:
            await kubelet.wait_until(listed(GPU, 8), WAIT)
            assert agent.serving()
            assert kubelet.resource(NIC) is None
            assert not (plugin_dir / "node-agent-rdma-roce.sock").exists()
            assert {r.resource_name for r in kubelet.registrations} == {GPU}
            (said,) = events(captured, "resource_without_devices")
            assert said["resource"] == NIC
            assert [e["family"] for e in events(captured, "family_without_devices")] == ["roce"]

            edit_node(lambda d: d.__setitem__("nics", nics))  # NICs appear
            await kubelet.wait_until(listed(NIC, 8), WAIT)


async def test_node_without_gpus_registers_no_gpu_resource_and_says_so(
    node_file: Path, plugin_dir: Path, edit_node: EditNode, kubelet: Kubelet
) -> None:
    edit_node(lambda d: d.__setitem__("gpus", []))
    with logs() as captured:
        async with agent_on(node_file, plugin_dir):
            await kubelet.wait_until(listed(NIC, 8), WAIT)
            assert kubelet.resource(GPU) is None
            assert {r.resource_name for r in kubelet.registrations} == {NIC}
    assert [e["family"] for e in events(captured, "family_without_devices")] == ["gpu"]
