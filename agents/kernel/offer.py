"""What a family offers every runtime, whichever API serves it: its resources (device
lists kept current), the facts of its devices, their health, and what a container gets
for a set of them. Each runtime turns these into its own wire form."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from agents.core.health import DeviceHealth
from agents.kernel.catalogue import Resource
from agents.kernel.edits import Consumed, ContainerEdits, DeviceKey
from agents.kernel.facts import FamilyFacts


class Offer(Protocol):
    @property
    def name(self) -> str: ...

    def resources(self) -> Sequence[Resource]: ...

    def facts(self) -> FamilyFacts:
        """The family's devices with their attributes and capacities, each tied to the
        resource (and device ID) that serves it; read again whenever a resource's
        inventory changes."""
        ...

    def device_health(self) -> list[DeviceHealth]:
        """Every advertised device's health and why."""
        ...

    def edits(
        self, devices: Sequence[DeviceKey], consumed: Consumed | None = None
    ) -> ContainerEdits:
        """What one container gets for these devices (resource, device ID) together;
        `consumed`: what shares of them the claim holds (devices shared, not whole)."""
        ...
