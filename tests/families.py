"""Families built as the agent builds them (discovery, then the family), for the tests
that drive one family without an agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agents.config import Config
from agents.gpu.family import GpuFamily
from agents.gpu.kind import discover_gpus
from agents.hw.netlink import LinkMonitor
from agents.hw.nvml import Nvml
from agents.hw.sysfs import Sysfs
from agents.roce.family import RoceFamily, discover_nics


def gpu_family(
    nvml: Nvml,
    sysfs: Sysfs,
    config: Config,
    *,
    source: str = "<test>",
    dev_root: Path | None = None,
    **options: Any,
) -> GpuFamily:
    """Blocking: NVML initialised and asked, as at the agent's start."""
    return GpuFamily(nvml, discover_gpus(nvml, sysfs, config, source, dev_root), config, **options)


def roce_family(sysfs: Sysfs, links: LinkMonitor, config: Config, **options: Any) -> RoceFamily:
    return RoceFamily(sysfs, links, discover_nics(sysfs, config), config, **options)
