"""The interface between the agent and a device family (GPU, RoCE, ...)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from agents.plugin.resource import Resource


class Family(Protocol):
    """A family discovers its devices, offers resources and keeps their health current."""

    @property
    def name(self) -> str: ...

    def resources(self) -> Sequence[Resource]: ...

    async def run(self, stop: asyncio.Event) -> None:
        """Health and discovery loop; returns when `stop` is set."""
        ...
