"""Families built as the agent builds them (discovery, then the family), for the tests
that drive one family without an agent; and a running agent's families and servers."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from agents.config import Config
from agents.daemon import Agent
from agents.gpu.family import GpuFamily
from agents.gpu.kind import discover_gpus
from agents.hw.netlink import LinkMonitor
from agents.hw.nvml import Nvml
from agents.hw.sysfs import Sysfs
from agents.plugin.manager import PluginManager
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


F = TypeVar("F")


def running_family(agent: Agent, of_type: type[F]) -> F:
    """The agent's running family of this type; the test fails when it has none."""
    family = agent.family(of_type)
    assert family is not None, f"no {of_type.__name__} runs"
    return family


def plugin_manager(agent: Agent) -> PluginManager:
    """The device-plugin runtime of a started agent."""
    assert isinstance(agent.manager, PluginManager), "the agent serves no device plugins"
    return agent.manager
