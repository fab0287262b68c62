"""Health as one typed value: each cause as an operator reads it, as the log and metrics
name it, and as a DRA taint; the grade a device has from its cause."""

from __future__ import annotations

import pytest

from agents.core.health import (
    Cause,
    DeviceHealth,
    GpuLost,
    Grade,
    Holding,
    LinkNotUp,
    NvmlError,
    NvmlHung,
    PortNotActive,
    Signal,
    Taint,
    Xids,
)

GPU_DRIVER = "gpu.nvidia.com"
NIC_DRIVER = "roce.node-agents.io"
PCIE_X8 = Signal("pcie-width", "PCIe link x8 of x16", (("current", 8), ("max", 16)))


@pytest.mark.parametrize(
    ("cause", "text", "label"),
    [
        (Xids((79,)), "XID 79 (fell off the bus)", "xid=79"),
        (Xids((48,)), "XID 48 (uncorrectable ECC)", "xid=48"),
        (Xids((48, 79)), "XID 48 (uncorrectable ECC), XID 79 (fell off the bus)", "xid=48,79"),
        (Xids((999,)), "XID 999", "xid=999"),
        (GpuLost(), "NVML: GPU is lost", "lost"),
        (NvmlHung(), "NVML: no answer (hung)", "hung"),
        (NvmlError("Unknown"), "NVML: Unknown", "nvml: Unknown"),
        (Holding(), "recovering: NVML answers again", "holding"),
        (LinkNotUp("down"), "link down", "link_down"),
        (LinkNotUp("absent"), "link absent", "link_absent"),
        (PortNotActive("down"), "RDMA port down", "port_down"),
        (PortNotActive("absent"), "RDMA port absent", "port_absent"),
        (PCIE_X8, "PCIe link x8 of x16", "pcie-width"),
    ],
    ids=str,
)
def test_a_cause_names_the_fault_as_an_operator_and_the_log_know_it(
    cause: Cause, text: str, label: str
) -> None:
    assert (cause.text(), cause.label) == (text, label)


@pytest.mark.parametrize(
    ("cause", "driver", "taint"),
    [
        (Xids((79,)), GPU_DRIVER, Taint("gpu.nvidia.com/xid", "79")),
        (Xids((48, 79)), GPU_DRIVER, Taint("gpu.nvidia.com/xid", "48")),
        (GpuLost(), GPU_DRIVER, Taint("gpu.nvidia.com/gpu-lost")),
        (NvmlHung(), GPU_DRIVER, Taint("gpu.nvidia.com/unhealthy", "hung")),
        (Holding(), GPU_DRIVER, Taint("gpu.nvidia.com/unhealthy", "holding")),
        (NvmlError("Unknown"), GPU_DRIVER, Taint("gpu.nvidia.com/unhealthy", "nvml-Unknown")),
        (
            NvmlError("Driver Not Loaded: again"),
            GPU_DRIVER,
            Taint("gpu.nvidia.com/unhealthy", "nvml-Driver-Not-Loaded-again"),
        ),
        (NvmlError("x" * 80), GPU_DRIVER, Taint("gpu.nvidia.com/unhealthy", "nvml-" + "x" * 58)),
        (LinkNotUp("down"), NIC_DRIVER, Taint("roce.node-agents.io/link-down")),
        (PortNotActive("init"), NIC_DRIVER, Taint("roce.node-agents.io/link-down")),
        (PCIE_X8, GPU_DRIVER, Taint("node-agents.io/degraded", "pcie-width")),
    ],
    ids=str,
)
def test_a_cause_gives_the_taint_its_device_carries(
    cause: Cause, driver: str, taint: Taint
) -> None:
    assert cause.taint(driver) == taint


def test_a_device_without_a_cause_is_healthy_and_its_cause_sets_its_grade() -> None:
    assert DeviceHealth("nvidia.com/gpu", "GPU-0", "GPU 0").grade is Grade.HEALTHY
    assert DeviceHealth("nvidia.com/gpu", "GPU-0", "GPU 0", GpuLost()).grade is Grade.UNHEALTHY
    degraded = DeviceHealth("nvidia.com/gpu", "GPU-0", "GPU 0", PCIE_X8)
    assert degraded.grade is Grade.DEGRADED
    assert degraded.cause is not None and degraded.cause.figures() == {"current": 8, "max": 16}


def test_only_holding_is_no_news_and_equal_causes_are_the_same_fault() -> None:
    assert [c.news for c in (Holding(), GpuLost(), Xids((79,)))] == [False, True, True]
    assert Xids((48, 79)) == Xids((48, 79)) != Xids((79,))
    assert NvmlError("Unknown") != NvmlError("Timeout")
