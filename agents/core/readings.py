"""The readings behind the degraded-device signals as plain numbers by name, for the
always-on gauges (agents/metrics.py READINGS): what one probe read, whatever its verdict.
None: NVML or sysfs does not offer it."""

from __future__ import annotations

from agents.core.gpu_signals import CLOCK_EVENTS, GpuReading
from agents.core.nic_signals import NicReading

Readings = dict[str, float | None]


def gpu_readings(r: GpuReading) -> Readings:
    """A GPU's: PCIe link, utilization, replays, NVLinks, slowdown, memory repairs, its
    NVLink fabric's health mask, and memory in use, power, temperature and SM clock."""
    links = r.nvlinks
    slowdown = None if r.clock_events is None else r.clock_events & sum(CLOCK_EVENTS) != 0
    return {
        "gpu_pcie_link_width": r.pcie_width,
        "gpu_pcie_link_width_max": r.pcie_max_width,
        "gpu_pcie_link_gen": r.pcie_gen,
        "gpu_pcie_link_gen_max": r.pcie_max_gen,
        "gpu_utilization_percent": r.utilization,
        "gpu_pcie_replays": r.pcie_replays,
        "gpu_nvlinks": None if links is None else len(links),
        "gpu_nvlinks_active": None if links is None else sum(links),
        "gpu_hw_slowdown": _flag(slowdown),
        "gpu_row_remap_pending": _flag(r.remap_pending),
        "gpu_row_remap_failed": _flag(r.remap_failed),
        "gpu_retired_pages_pending": _flag(r.retired_pages_pending),
        "gpu_fabric_health_mask": None if r.fabric is None else r.fabric.health_mask,
        "gpu_memory_used_bytes": r.memory_used_bytes,
        "gpu_memory_total_bytes": r.memory_total_bytes,
        "gpu_power_watts": r.power_watts,
        "gpu_temperature_celsius": r.temperature_celsius,
        "gpu_sm_clock_mhz": r.sm_clock_mhz,
    }


def nic_readings(r: NicReading, expected_mbps: int | None) -> Readings:
    """A NIC's: its link speed and the speed it is expected to run at."""
    speed = r.speed_mbps if r.speed_mbps is not None and r.speed_mbps > 0 else None
    return {"nic_link_speed_mbps": speed, "nic_link_speed_expected_mbps": expected_mbps}


def _flag(value: bool | None) -> float | None:
    return None if value is None else float(value)
