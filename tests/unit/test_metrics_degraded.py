"""Degraded devices in the metrics: a series per signal out of limits, 1 while it is and 0
once it is not; the figures behind the signals; the always-on readings of a probe."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client.parser import text_string_to_metric_families

from agents.core.device import Device
from agents.core.gfd_facts import Fabric
from agents.core.gpu_signals import GpuReading
from agents.core.health import DeviceHealth, Signal, Signals, Xids
from agents.core.nic_signals import NicReading
from agents.core.readings import gpu_readings, nic_readings
from agents.health_fanout import HealthFanout
from agents.kernel.catalogue import Inventory, Resource
from agents.kernel.edits import ContainerEdits
from agents.metrics import READINGS, Metrics

GPU = ("nvidia.com/gpu", "GPU-0", "GPU 0")
X8 = Signal("pcie-width", "PCIe link x8 of x16", (("width", 8), ("maxWidth", 16)))
X4 = Signal("pcie-width", "PCIe link x4 of x16", (("width", 4), ("maxWidth", 16)))
LINKS = Signal("nvlink-down", "NVLink 2 of 18 links down", (("down", 2), ("links", 18)))
SLOW = Signal("hw-slowdown", "hwSlowdown on 3 probes in a row", (("reasons", "hwSlowdown"),))


def samples(metrics: Metrics, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of one family, by their sorted labels."""
    text = metrics.exposition().decode()
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        if family.name == name
        for s in family.samples
    }


def degraded(metrics: Metrics) -> dict[str, float]:
    found = samples(metrics, "node_agent_device_degraded")
    return {dict(k)["signal"]: v for k, v in found.items()}


def figures(metrics: Metrics) -> dict[tuple[str, str], float]:
    found = samples(metrics, "node_agent_device_signal_figure")
    return {(dict(k)["signal"], dict(k)["figure"]): v for k, v in found.items()}


def test_each_signal_out_of_limits_is_one_and_zero_again_once_it_is_not() -> None:
    metrics = Metrics()
    fanout = HealthFanout(metrics)
    fanout.publish([DeviceHealth(*GPU, X8)])
    assert degraded(metrics) == {"pcie-width": 1}
    fanout.publish([DeviceHealth(*GPU, Signals((X8, LINKS, SLOW)))])
    assert degraded(metrics) == {"pcie-width": 1, "nvlink-down": 1, "hw-slowdown": 1}
    fanout.publish([DeviceHealth(*GPU, LINKS)])
    assert degraded(metrics) == {"pcie-width": 0, "nvlink-down": 1, "hw-slowdown": 0}
    fanout.publish([DeviceHealth(*GPU, Xids((79,)))])  # Unhealthy: no longer Degraded
    assert set(degraded(metrics).values()) == {0}
    labels = next(iter(samples(metrics, "node_agent_device_degraded")))
    assert dict(labels)["resource"] == "nvidia.com/gpu" and dict(labels)["device"] == "GPU-0"


def test_figures_follow_the_signal_and_leave_with_it() -> None:
    metrics = Metrics()
    fanout = HealthFanout(metrics)
    fanout.publish([DeviceHealth(*GPU, X8)])
    assert figures(metrics) == {("pcie-width", "width"): 8, ("pcie-width", "maxWidth"): 16}
    fanout.publish([DeviceHealth(*GPU, X4)])  # no Event, but the figure moves
    assert figures(metrics)[("pcie-width", "width")] == 4
    fanout.publish([DeviceHealth(*GPU, Signals((X4, SLOW)))])  # text figures are no gauge
    assert set(figures(metrics)) == {("pcie-width", "width"), ("pcie-width", "maxWidth")}
    fanout.publish([DeviceHealth(*GPU)])
    assert figures(metrics) == {}


def test_a_gpu_probe_becomes_the_reading_gauges_and_unoffered_ones_are_absent() -> None:
    metrics = Metrics()
    reading = GpuReading(
        pcie_width=8,
        pcie_max_width=16,
        pcie_gen=5,
        pcie_max_gen=5,
        utilization=70,
        nvlinks=(True, False, True),
        clock_events=0x40,
        remap_pending=False,
        fabric=Fabric("5a1e2b3c-4d5e-4f60-8172-839405a6b7c8", 1, 3, 0, health_mask=0x19A),
        memory_used_bytes=3 << 30,
        memory_total_bytes=80 << 30,
        power_watts=312.5,
        temperature_celsius=64,
    )
    metrics.readings("nvidia.com/gpu", "GPU-0", gpu_readings(reading))
    got = {
        name: samples(metrics, f"node_agent_{name}").get(
            (("device", "GPU-0"), ("resource", "nvidia.com/gpu"))
        )
        for name in READINGS
        if name.startswith("gpu_")
    }
    assert got == {
        "gpu_pcie_link_width": 8,
        "gpu_pcie_link_width_max": 16,
        "gpu_pcie_link_gen": 5,
        "gpu_pcie_link_gen_max": 5,
        "gpu_utilization_percent": 70,
        "gpu_pcie_replays": None,  # not offered: no series
        "gpu_nvlinks": 3,
        "gpu_nvlinks_active": 2,
        "gpu_hw_slowdown": 1,
        "gpu_row_remap_pending": 0,
        "gpu_row_remap_failed": None,
        "gpu_retired_pages_pending": None,
        "gpu_fabric_health_mask": 0x19A,  # route unhealthy
        "gpu_memory_used_bytes": 3 << 30,
        "gpu_memory_total_bytes": 80 << 30,
        "gpu_power_watts": 312.5,
        "gpu_temperature_celsius": 64,
        "gpu_sm_clock_mhz": None,
    }
    metrics.readings("nvidia.com/gpu", "GPU-0", gpu_readings(GpuReading()))
    assert samples(metrics, "node_agent_gpu_pcie_link_width") == {}


def test_a_nic_probe_gives_its_speed_and_the_expected_one_and_no_speed_while_down() -> None:
    metrics = Metrics()
    key = (("device", "0000:1c:00.0"), ("resource", "rdma/roce"))
    metrics.readings("rdma/roce", key[0][1], nic_readings(NicReading(speed_mbps=100000), 400000))
    assert samples(metrics, "node_agent_nic_link_speed_mbps") == {key: 100000}
    assert samples(metrics, "node_agent_nic_link_speed_expected_mbps") == {key: 400000}
    metrics.readings("rdma/roce", key[0][1], nic_readings(NicReading(speed_mbps=-1), 400000))
    assert samples(metrics, "node_agent_nic_link_speed_mbps") == {}


class Listed:
    """A resource as the metrics read it: its name and inventory."""

    def __init__(self, devices: list[Device]) -> None:
        self.name = "nvidia.com/gpu"
        self.inventory = Inventory(devices)

    def physical_id(self, device_id: str) -> str:
        return device_id

    def allocate(self, device_ids: Sequence[str]) -> ContainerEdits:
        raise NotImplementedError

    def preferred(
        self, available: Sequence[str], must_include: Sequence[str], size: int
    ) -> list[str]:
        raise NotImplementedError


def test_devices_are_counted_by_grade_whatever_the_kubelet_is_told() -> None:
    metrics = Metrics()
    devices = [
        Device("a"),
        Device("b", degraded=True),  # told Healthy
        Device("c", healthy=False, degraded=True),  # report: unhealthy
        Device("d", healthy=False),
    ]
    resource: Resource = Listed(devices)
    metrics.watch_resources(lambda: [resource])
    found = {dict(k)["health"]: v for k, v in samples(metrics, "node_agent_devices").items()}
    assert found == {"Healthy": 1, "Degraded": 2, "Unhealthy": 1}
