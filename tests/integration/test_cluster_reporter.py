"""The reporter against the API-server stand-in over real HTTP: the condition from the
current state, repeats counted into one Event, and the API server's errors and outages
(409, 404, 5xx, refused, never answering) ending with the server true to the state."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from structlog.testing import capture_logs

from agents.cluster.client import Access, ApiClient
from agents.cluster.reporter import Reporter
from agents.core.health import DeviceHealth, LinkNotUp, Signal, Signals, Xids
from agents.core.node_report import note_of
from agents.health_fanout import HealthFanout
from agents.tasks import until
from tests.conditions import WAIT, async_wait_until
from tests.standin.apiserver import HANG, REFUSE, UP, ApiServer

NODE = "node-1"
GPU0 = DeviceHealth("nvidia.com/gpu", "GPU-0", "GPU 0")
GPU0_XID = DeviceHealth("nvidia.com/gpu", "GPU-0", "GPU 0", Xids((79,)))
NIC_UP = DeviceHealth("rdma/roce", "0000:1c:00.0", "interface ens1np0")
NIC_DOWN = DeviceHealth("rdma/roce", "0000:1c:00.0", "interface ens1np0", LinkNotUp("down"))


@dataclass
class Setup:
    server: ApiServer
    reporter: Reporter
    state: dict[str, DeviceHealth] = field(default_factory=dict)

    def change(self, device: DeviceHealth) -> None:
        self.state[device.device_id] = device
        self.reporter.changed(device)

    def condition(self, kind: str = "DevicesHealthy") -> dict[str, str] | None:
        return self.server.store.condition(NODE, kind)

    def events(self) -> list[dict[str, object]]:
        return list(self.server.store.event_list("default")["items"])

    def counts(self) -> dict[str, int]:
        """Event counts summed per reason."""
        sums: dict[str, int] = {}
        for e in self.events():
            sums[str(e["reason"])] = sums.get(str(e["reason"]), 0) + int(str(e["count"]))
        return sums


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    server = ApiServer((NODE,))
    await server.start()
    client = ApiClient(Access(server.url), timeout_s=0.5)
    reporter = Reporter(NODE, client, first_retry_s=0.05, max_retry_s=0.2, settle_s=0)
    s = Setup(server, reporter, {GPU0.device_id: GPU0, NIC_UP.device_id: NIC_UP})
    stop = asyncio.Event()
    task = asyncio.ensure_future(until(stop, lambda: reporter.run(lambda: list(s.state.values()))))
    try:
        yield s
    finally:
        stop.set()
        await asyncio.wait_for(task, WAIT)
        await server.stop()


async def test_start_sets_the_condition_true_and_makes_no_event(setup: Setup) -> None:
    await async_wait_until(lambda: setup.condition() is not None, WAIT)
    condition = setup.condition()
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", "DevicesHealthy")
    assert setup.events() == []
    ready = setup.server.store.condition(NODE, "Ready")
    assert ready is not None and ready["status"] == "True"  # the kubelet's conditions stay


async def test_fault_makes_a_warning_event_and_the_condition_false(setup: Setup) -> None:
    await async_wait_until(lambda: setup.condition() is not None, WAIT)
    setup.change(GPU0_XID)
    await async_wait_until(lambda: len(setup.events()) == 1, WAIT)
    event = setup.events()[0]
    assert event["type"] == "Warning" and event["reason"] == "DeviceUnhealthy"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Node",
        "name": NODE,
        "uid": NODE,
    }
    assert event["source"] == {"component": "node-agent", "host": NODE}
    assert "GPU-0 (GPU 0) is Unhealthy: XID 79 (fell off the bus)" in str(event["message"])
    await async_wait_until(lambda: (setup.condition() or {}).get("status") == "False", WAIT)
    condition = setup.condition()
    assert (
        condition is not None and "GPU-0 (GPU 0): XID 79 (fell off the bus)" in condition["message"]
    )


async def test_twenty_flaps_make_two_events_whose_counts_add_up(setup: Setup) -> None:
    for _ in range(20):
        setup.change(NIC_DOWN)
        await asyncio.sleep(0)  # flaps interleaved with the reporter's calls
        setup.change(NIC_UP)
    await async_wait_until(
        lambda: setup.counts() == {"DeviceUnhealthy": 20, "DeviceHealthy": 20}, WAIT
    )
    assert len(setup.events()) == 2
    await async_wait_until(lambda: (setup.condition() or {}).get("status") == "True", WAIT)


async def test_server_errors_are_retried_until_the_event_is_there(setup: Setup) -> None:
    await async_wait_until(lambda: setup.condition() is not None, WAIT)
    setup.server.fail_next(500, times=2, method="POST")
    setup.server.fail_next(503, times=1, method="PATCH")
    setup.change(GPU0_XID)
    await async_wait_until(lambda: setup.counts() == {"DeviceUnhealthy": 1}, WAIT)
    await async_wait_until(lambda: (setup.condition() or {}).get("status") == "False", WAIT)
    codes = [c.code for c in setup.server.calls]
    assert codes.count(500) == 2 and codes.count(503) == 1


async def test_an_event_already_made_is_patched_after_a_409(setup: Setup) -> None:
    await async_wait_until(lambda: setup.condition() is not None, WAIT)
    record = setup.reporter.book.add(note_of(GPU0_XID), "t0")
    # As if an earlier POST had made it and its answer was lost.
    made = {"metadata": {"name": record.name}, "involvedObject": {}, "reason": "DeviceUnhealthy"}
    setup.server.store.create_event("default", {**made, "count": 1})
    setup.change(GPU0_XID)
    await async_wait_until(lambda: setup.counts().get("DeviceUnhealthy") == 2, WAIT)
    assert [c.code for c in setup.server.calls if c.method == "POST"] == [409]


async def test_an_expired_event_is_made_again(setup: Setup) -> None:
    setup.change(GPU0_XID)
    await async_wait_until(lambda: setup.counts() == {"DeviceUnhealthy": 1}, WAIT)
    setup.server.store.events.clear()  # the API server's event TTL passed
    setup.change(GPU0)
    setup.change(GPU0_XID)
    await async_wait_until(
        lambda: setup.counts() == {"DeviceUnhealthy": 2, "DeviceHealthy": 1}, WAIT
    )
    assert 404 in [c.code for c in setup.server.calls]


@pytest.mark.parametrize("outage", [REFUSE, HANG])
async def test_after_an_outage_the_server_is_true_to_the_state(setup: Setup, outage: str) -> None:
    await async_wait_until(lambda: setup.condition() is not None, WAIT)
    with capture_logs() as logs:
        await setup.server.set_mode(outage)
        setup.change(NIC_DOWN)
        await async_wait_until(lambda: setup.reporter.reachable is False, WAIT)
        setup.change(NIC_UP)
        setup.change(NIC_DOWN)
        setup.change(GPU0_XID)
        await asyncio.sleep(0)
        await setup.server.set_mode(UP)
        await async_wait_until(
            lambda: setup.counts() == {"DeviceUnhealthy": 3, "DeviceHealthy": 1}, WAIT
        )
        await async_wait_until(lambda: (setup.condition() or {}).get("status") == "False", WAIT)
        # The stand-in holds the last Event before the reporter has read its answer.
        await async_wait_until(lambda: setup.reporter.reachable is True, WAIT)
    condition = setup.condition()
    assert condition is not None
    assert "GPU-0" in condition["message"] and "link down" in condition["message"]
    assert [e["event"] for e in logs].count("cluster_unreachable") == 1  # one line per outage
    assert "cluster_reachable" in [e["event"] for e in logs]


async def test_the_agent_touches_only_events_and_its_node_status(setup: Setup) -> None:
    setup.change(GPU0_XID)
    setup.change(GPU0)
    await async_wait_until(lambda: len(setup.events()) == 2, WAIT)
    allowed = {
        ("POST", "/api/v1/namespaces/default/events"),
        ("PATCH", f"/api/v1/nodes/{NODE}/status"),
    }
    for call in setup.server.calls:
        key = (call.method, call.path)
        assert key in allowed or (
            call.method == "PATCH" and call.path.startswith("/api/v1/namespaces/default/events/")
        ), key
    patches = {c.content_type for c in setup.server.calls if c.method == "PATCH"}
    assert patches == {"application/strategic-merge-patch+json"}


async def test_an_event_refused_as_invalid_holds_up_no_other(setup: Setup) -> None:
    await async_wait_until(lambda: setup.condition() is not None, WAIT)
    setup.server.fail_next(422, times=1, method="POST")
    setup.change(GPU0_XID)
    setup.change(NIC_DOWN)
    await async_wait_until(lambda: len(setup.events()) == 1, WAIT)
    assert "interface ens1np0" in str(setup.events()[0]["message"])
    await async_wait_until(lambda: (setup.condition() or {}).get("status") == "False", WAIT)


X8 = Signal("pcie-width", "PCIe link x8 of x16", (("width", 8), ("maxWidth", 16)))
X4 = Signal("pcie-width", "PCIe link x4 of x16", (("width", 4), ("maxWidth", 16)))
LINKS = Signal("nvlink-down", "NVLink 2 of 18 links down", (("down", 2), ("links", 18)))
SLOW = Signal("link-speed", "ens1np0 at 100000 Mb/s, expected 400000", (("speedMbps", 100000),))


def said(setup: Setup) -> set[tuple[str, str, str]]:
    """(type, reason, message) of each Event on the API server."""
    return {(str(e["type"]), str(e["reason"]), str(e["message"])) for e in setup.events()}


async def test_degraded_devices_through_the_fanout_reach_events_and_both_conditions(
    setup: Setup,
) -> None:
    fanout = HealthFanout(reporter=setup.change)
    await async_wait_until(lambda: setup.condition("DevicesDegraded") is not None, WAIT)
    degraded = setup.condition("DevicesDegraded")
    assert degraded is not None
    assert (degraded["status"], degraded["reason"]) == ("False", "NoDeviceDegraded")
    nic = DeviceHealth(NIC_UP.resource, NIC_UP.device_id, NIC_UP.where, SLOW)
    for state in (DeviceHealth(GPU0.resource, GPU0.device_id, GPU0.where, X8), nic):
        setup.state[state.device_id] = state
        fanout.publish([state])
    await async_wait_until(lambda: setup.counts() == {"DeviceDegraded": 2}, WAIT)
    assert said(setup) == {
        (
            "Warning",
            "DeviceDegraded",
            "nvidia.com/gpu device GPU-0 (GPU 0) is Degraded: PCIe link x8 of x16",
        ),
        (
            "Warning",
            "DeviceDegraded",
            "rdma/roce device 0000:1c:00.0 (interface ens1np0) is Degraded: "
            "ens1np0 at 100000 Mb/s, expected 400000",
        ),
    }
    await async_wait_until(
        lambda: (setup.condition("DevicesDegraded") or {}).get("status") == "True", WAIT
    )
    degraded = setup.condition("DevicesDegraded")
    assert degraded is not None and degraded["reason"] == "DeviceDegraded"
    assert degraded["message"].startswith("2 of 2 devices Degraded: nvidia.com/gpu GPU-0")
    assert "ens1np0 at 100000 Mb/s, expected 400000" in degraded["message"]
    healthy = setup.condition()
    assert healthy is not None and healthy["status"] == "True"  # Degraded is not Unhealthy


async def test_degraded_signal_changes_and_recovery_as_the_api_server_sees_them(
    setup: Setup,
) -> None:
    fanout = HealthFanout(reporter=setup.change)

    def gpu(cause: Signal | Signals | Xids | None) -> None:
        state = DeviceHealth(GPU0.resource, GPU0.device_id, GPU0.where, cause)
        setup.state[state.device_id] = state
        fanout.publish([state])

    await async_wait_until(lambda: setup.condition("DevicesDegraded") is not None, WAIT)
    gpu(X8)
    gpu(X4)  # the same signal, new figures: no Event
    gpu(Signals((X4, LINKS)))  # another signal: news
    gpu(Xids((79,)))
    gpu(None)
    await async_wait_until(
        lambda: setup.counts() == {"DeviceDegraded": 2, "DeviceUnhealthy": 1, "DeviceHealthy": 1},
        WAIT,
    )
    what = "nvidia.com/gpu device GPU-0 (GPU 0) is"
    assert said(setup) == {
        ("Warning", "DeviceDegraded", f"{what} Degraded: PCIe link x8 of x16"),
        (
            "Warning",
            "DeviceDegraded",
            f"{what} Degraded: PCIe link x4 of x16; NVLink 2 of 18 links down",
        ),
        ("Warning", "DeviceUnhealthy", f"{what} Unhealthy: XID 79 (fell off the bus)"),
        ("Normal", "DeviceHealthy", f"{what} Healthy again"),
    }
    await async_wait_until(
        lambda: (setup.condition("DevicesDegraded") or {}).get("status") == "False", WAIT
    )
    history = setup.server.store.condition_history(NODE, "DevicesDegraded")
    assert history[0] == "False" and history[-1] == "False"
