"""The ResourceSlice publisher against the API-server stand-in over real HTTP: the slices
at start in their exact shape, health taking devices out and back (or tainting them), a
Degraded device's grade and taint, NoExecute with eviction, a deleted slice put back, an
API server down at start, a driver of more than 128 devices, and no requests at rest
beyond the open watch."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from agents.cluster.client import Access, ApiClient
from agents.core.health import GpuLost, Grade, Signal, Xids
from agents.dra.publisher import SlicePublisher
from agents.kernel.facts import DeviceFacts, FamilyFacts, Version
from tests.conditions import WAIT, async_wait_until
from tests.standin.apiserver import REFUSE, UP, ApiServer

NODE = "node-1"
DRIVER = "gpu.nvidia.com"
SLICES = "resourceslices"


def _gpus(n: int, driver: str = DRIVER) -> FamilyFacts:
    devices = tuple(
        DeviceFacts(
            f"gpu-{i}",
            "nvidia.com/gpu",
            f"GPU-{i}",
            {
                "type": "gpu",
                "index": i,
                "driverVersion": Version("570.124.6"),
                "resource.kubernetes.io/pcieRoot": "pci0000:10",
                "mig": False,
            },
            {"memory": "81920Mi"},
        )
        for i in range(n)
    )
    return FamilyFacts(driver, devices)


def _ours(server: ApiServer, driver: str = DRIVER) -> list[dict[str, Any]]:
    return sorted(
        (s for s in server.store.slices.values() if s["spec"]["driver"] == driver),
        key=lambda s: s["metadata"]["name"],
    )


def _names(server: ApiServer) -> list[str]:
    return [d["name"] for s in _ours(server) for d in s["spec"]["devices"]]


def _writes(server: ApiServer) -> int:
    return sum(server.count(v, SLICES) for v in ("create", "update", "delete"))


async def _running(publisher: SlicePublisher) -> asyncio.Task[None]:
    return asyncio.create_task(publisher.run())


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_slices_at_start_have_the_api_shape(server: ApiServer, client: ApiClient) -> None:
    publisher = SlicePublisher(NODE, client)
    publisher.set(_gpus(2), {})
    task = await _running(publisher)
    try:
        await async_wait_until(lambda: len(_ours(server)) == 1, WAIT, "one slice")
    finally:
        await _stop(task)
    (made,) = _ours(server)
    meta = made["metadata"]
    assert meta["name"] == "node-1-gpu-nvidia-com-0"
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": "uid-node-1", "controller": True}
    ]
    assert made["spec"] == {
        "driver": DRIVER,
        "nodeName": NODE,
        "pool": {"name": NODE, "generation": 0, "resourceSliceCount": 1},
        "devices": [
            {
                "name": f"gpu-{i}",
                "attributes": {
                    "type": {"string": "gpu"},
                    "index": {"int": i},
                    "driverVersion": {"version": "570.124.6"},
                    "resource.kubernetes.io/pcieRoot": {"string": "pci0000:10"},
                    "mig": {"bool": False},
                    "node-agents.io/health": {"string": "Healthy"},
                },
                "capacity": {"memory": {"value": "81920Mi"}},
            }
            for i in range(2)
        ],
    }
    assert server.count("get", "nodes") == 1  # the Node's UID, once


async def test_an_unhealthy_device_leaves_the_slice_and_returns(
    server: ApiServer, client: ApiClient
) -> None:
    publisher = SlicePublisher(NODE, client)
    gpus = _gpus(3)
    publisher.set(gpus, {})
    task = await _running(publisher)
    try:
        await async_wait_until(lambda: len(_names(server)) == 3, WAIT, "3 devices")
        publisher.set(gpus, {"gpu-1": Xids((79,))})
        await async_wait_until(lambda: _names(server) == ["gpu-0", "gpu-2"], WAIT, "gpu-1 out")
        assert _ours(server)[0]["spec"]["pool"]["generation"] == 1
        publisher.set(gpus, {})
        await async_wait_until(lambda: len(_names(server)) == 3, WAIT, "gpu-1 back")
        assert _ours(server)[0]["spec"]["pool"]["generation"] == 2
    finally:
        await _stop(task)


async def test_with_taints_an_unhealthy_device_stays_tainted(
    server: ApiServer, client: ApiClient
) -> None:
    publisher = SlicePublisher(NODE, client, device_taints=True)
    gpus = _gpus(2)
    publisher.set(gpus, {"gpu-0": Xids((79,))})
    task = await _running(publisher)
    try:
        await async_wait_until(lambda: len(_names(server)) == 2, WAIT, "both devices")
        writes = _writes(server)
        devices = _ours(server)[0]["spec"]["devices"]
        taint = devices[0]["taints"][0]
        assert {k: v for k, v in taint.items() if k != "timeAdded"} == {
            "key": f"{DRIVER}/xid",
            "value": "79",
            "effect": "NoSchedule",
        }
        assert "taints" not in devices[1]
    finally:
        await _stop(task)
    # Started again, it finds the slice as it wants it, though the server added a time
    # to the taint: nothing to write.
    again = SlicePublisher(NODE, client, device_taints=True)
    again.set(gpus, {"gpu-0": Xids((79,))})
    task = await _running(again)
    try:
        await async_wait_until(lambda: server.count("list", SLICES) == 2, WAIT, "a new list")
        await async_wait_until(lambda: server.watching == 1, WAIT, "the watch")
        await async_wait_until(lambda: again.settled, WAIT, "the slice compared")
        assert _writes(server) == writes
    finally:
        await _stop(task)


PCIE = Signal("pcie-width", "PCIe link x8 of x16", (("width", 8), ("maxWidth", 16)))


def _device(server: ApiServer, name: str) -> dict[str, Any]:
    return next(d for s in _ours(server) for d in s["spec"]["devices"] if d["name"] == name)


def _health(server: ApiServer, name: str) -> str:
    return str(_device(server, name)["attributes"]["node-agents.io/health"]["string"])


def _taints(server: ApiServer, name: str) -> list[tuple[str, str, str]]:
    device = _device(server, name)
    return [(t["key"], t.get("value", ""), t["effect"]) for t in device.get("taints", [])]


async def test_a_degraded_device_stays_with_its_grade_and_untainted_without_taints(
    server: ApiServer, client: ApiClient
) -> None:
    publisher = SlicePublisher(NODE, client)
    gpus = _gpus(2)
    publisher.set(gpus, {})
    task = await _running(publisher)
    try:
        await async_wait_until(lambda: len(_names(server)) == 2, WAIT, "2 devices")
        publisher.set(gpus, {"gpu-1": PCIE})
        await async_wait_until(lambda: _health(server, "gpu-1") == "Degraded", WAIT, "Degraded")
        assert _names(server) == ["gpu-0", "gpu-1"]
        assert _health(server, "gpu-0") == "Healthy"
        assert _taints(server, "gpu-1") == []
        publisher.set(gpus, {})
        await async_wait_until(lambda: _health(server, "gpu-1") == "Healthy", WAIT, "Healthy")
    finally:
        await _stop(task)


async def test_with_taints_a_degraded_device_carries_its_signal_noschedule(
    server: ApiServer, client: ApiClient
) -> None:
    publisher = SlicePublisher(NODE, client, device_taints=True, evict_unhealthy=True)
    publisher.set(_gpus(3), {"gpu-1": PCIE, "gpu-2": Xids((79,))})
    task = await _running(publisher)
    try:
        await async_wait_until(lambda: len(_names(server)) == 3, WAIT, "3 devices")
        assert _taints(server, "gpu-0") == []
        # Degraded: kept off by the scheduler, never evicted; Unhealthy with eviction on.
        assert _taints(server, "gpu-1") == [("node-agents.io/degraded", "pcie-width", "NoSchedule")]
        assert _taints(server, "gpu-2") == [(f"{DRIVER}/xid", "79", "NoExecute")]
        assert _health(server, "gpu-1") == "Degraded"
    finally:
        await _stop(task)


async def test_without_eviction_an_unhealthy_device_taint_is_noschedule(
    server: ApiServer, client: ApiClient
) -> None:
    publisher = SlicePublisher(NODE, client, device_taints=True)
    publisher.set(_gpus(2), {"gpu-1": Signal("row-remap-failed", "failed", level=Grade.UNHEALTHY)})
    task = await _running(publisher)
    try:
        await async_wait_until(lambda: len(_names(server)) == 2, WAIT, "2 devices")
        # An Unhealthy signal is a fault: the driver's unhealthy taint, not the Degraded one.
        assert _taints(server, "gpu-1") == [
            (f"{DRIVER}/unhealthy", "row-remap-failed", "NoSchedule")
        ]
    finally:
        await _stop(task)


async def test_an_api_server_that_drops_taints_is_not_written_again_and_again(
    server: ApiServer, client: ApiClient
) -> None:
    server.store.device_taints = False
    publisher = SlicePublisher(NODE, client, device_taints=True)
    publisher.set(_gpus(2), {"gpu-0": GpuLost()})
    task = await _running(publisher)
    try:
        await async_wait_until(lambda: len(_names(server)) == 2, WAIT, "both devices")
        await async_wait_until(lambda: server.watching == 1, WAIT, "the watch")
        publisher.set(_gpus(2), {"gpu-0": GpuLost()})  # a pass that compares again
        await async_wait_until(lambda: publisher.settled, WAIT, "the pass")
        assert _writes(server) == 1
    finally:
        await _stop(task)


async def test_a_deleted_slice_is_put_back_promptly(server: ApiServer, client: ApiClient) -> None:
    publisher = SlicePublisher(NODE, client)
    publisher.set(_gpus(2), {})
    task = await _running(publisher)
    try:
        await async_wait_until(lambda: len(_ours(server)) == 1, WAIT, "the slice")
        await async_wait_until(lambda: server.watching == 1, WAIT, "the watch")
        assert server.store.delete_node_slices(NODE) == ["node-1-gpu-nvidia-com-0"]
        start = time.monotonic()
        await async_wait_until(lambda: len(_ours(server)) == 1, WAIT, "the slice back")
        assert time.monotonic() - start < 1.0
        assert len(_names(server)) == 2
    finally:
        await _stop(task)


async def test_api_server_down_at_start_delays_only_the_slices(server: ApiServer) -> None:
    await server.set_mode(REFUSE)
    async with ApiClient(Access(server.url), timeout_s=0.5) as client:
        publisher = SlicePublisher(NODE, client, first_retry_s=0.05, max_retry_s=0.2)
        task = await _running(publisher)
        try:
            await async_wait_until(lambda: publisher.reachable is False, WAIT, "an outage")
            started = time.monotonic()
            for n in range(1, 50):
                publisher.set(_gpus(n % 3 + 1), {})
            assert time.monotonic() - started < 0.05  # set() never waits for the API
            publisher.set(_gpus(2), {})
            await server.set_mode(UP)
            await async_wait_until(lambda: len(_names(server)) == 2, WAIT, "slices once up")
        finally:
            await _stop(task)


async def test_a_slow_api_server_delays_only_the_slices(server: ApiServer) -> None:
    server.delay_s = 0.3
    async with ApiClient(Access(server.url), timeout_s=2.0) as client:
        publisher = SlicePublisher(NODE, client)
        task = await _running(publisher)
        try:
            started = time.monotonic()
            publisher.set(_gpus(2), {})
            assert time.monotonic() - started < 0.05
            await async_wait_until(lambda: len(_names(server)) == 2, WAIT, "slices, slowly")
        finally:
            await _stop(task)


async def test_a_driver_of_more_than_128_devices_is_split(
    server: ApiServer, client: ApiClient
) -> None:
    publisher = SlicePublisher(NODE, client)
    publisher.set(_gpus(300), {})
    task = await _running(publisher)
    try:
        await async_wait_until(lambda: len(_ours(server)) == 3, WAIT, "three slices")
        counts = [len(s["spec"]["devices"]) for s in _ours(server)]
        assert counts == [128, 128, 44]
        assert {s["spec"]["pool"]["resourceSliceCount"] for s in _ours(server)} == {3}
        publisher.set(_gpus(100), {})  # shrinks to one slice of a newer generation
        await async_wait_until(lambda: len(_ours(server)) == 1, WAIT, "one slice")
        assert _ours(server)[0]["spec"]["pool"] == {
            "name": NODE,
            "generation": 1,
            "resourceSliceCount": 1,
        }
    finally:
        await _stop(task)


async def test_other_drivers_and_nodes_are_left_alone(server: ApiServer, client: ApiClient) -> None:
    server.store.add_node("node-2")
    theirs: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": "theirs"},
        "spec": {
            "driver": "other.example.com",
            "nodeName": NODE,
            "pool": {"name": NODE, "generation": 0, "resourceSliceCount": 1},
            "devices": [],
        },
    }
    server.store.create_slice(theirs)
    server.store.create_slice(
        {
            **theirs,
            "metadata": {"name": "node-2-gpu"},
            "spec": {**theirs["spec"], "driver": DRIVER, "nodeName": "node-2"},
        }
    )
    publisher = SlicePublisher(NODE, client)
    publisher.set(_gpus(1), {})
    task = await _running(publisher)
    try:
        await async_wait_until(lambda: len(_ours(server)) == 2, WAIT, "ours beside node-2's")
    finally:
        await _stop(task)
    assert set(server.store.slices) == {"theirs", "node-2-gpu", "node-1-gpu-nvidia-com-0"}
    assert server.count("delete", SLICES) == 0


async def test_no_requests_at_rest_beyond_the_watch(server: ApiServer, client: ApiClient) -> None:
    server.bookmark_s = 0.05  # bookmarks keep coming: they must not cause requests
    publisher = SlicePublisher(NODE, client)
    publisher.set(_gpus(4), {})
    publisher.set(_ours_too := _gpus(2, "roce.node-agents.io"), {})
    task = await _running(publisher)
    try:
        await async_wait_until(
            lambda: len(_ours(server)) == 1 and len(_ours(server, _ours_too.driver)) == 1,
            WAIT,
            "both drivers' slices",
        )
        await async_wait_until(lambda: server.watching == 1, WAIT, "the watch")
        before, bookmarks = len(server.calls), server.bookmarks
        await async_wait_until(lambda: server.bookmarks >= bookmarks + 10, WAIT, "10 bookmarks")
        await async_wait_until(lambda: publisher.settled, WAIT, "the publisher at rest")
        assert server.calls[before:] == []
        assert server.count("watch", SLICES) == 1
    finally:
        await _stop(task)
