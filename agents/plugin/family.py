"""The interface between the agent and a device family (GPU, RoCE, ...)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from agents.core.node_report import DeviceHealth
from agents.plugin.resource import Resource


class Family(Protocol):
    """A family discovers its devices, offers resources and keeps their health current."""

    @property
    def name(self) -> str: ...

    def resources(self) -> Sequence[Resource]: ...

    def device_health(self) -> list[DeviceHealth]:
        """Every advertised device's health and why, as the cluster is told of it."""
        ...

    async def run(self, stop: asyncio.Event) -> None:
        """Health and discovery loop; returns when `stop` is set."""
        ...
