"""What the agent knows of a device family, and all it knows: the config sections it is
built from, how it is discovered and built, its resources, the facts of its devices, what
a container gets for them, labels and health. It says nothing of the API the devices are
served through: each runtime turns what a family offers (agents/kernel/offer.py) into its
own wire form. Adding a family adds a folder and a line in agents/families.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias, TypeVar

from agents.config import Config
from agents.core.health import DeviceHealth
from agents.core.ledger import PairingSide
from agents.core.topology import PciLocation
from agents.kernel.catalogue import Resource
from agents.kernel.edits import Consumed, ContainerEdits, DeviceKey
from agents.kernel.offer import Offer
from agents.timing import PRODUCTION, Timing

if TYPE_CHECKING:
    from agents.backends import Backends
    from agents.kernel.facts import FamilyFacts


class FamilyResource(Resource, Protocol):
    """A resource as the agent sees it, beyond what every runtime needs."""

    def definition(self) -> Hashable:
        """What the kubelet and its containers see of the resource, health aside: when
        this changes on a reload, the resource registers again."""
        ...

    @property
    def summary(self) -> str:
        """What its devices are, for the pairing log: "whole GPUs", "NICs", ..."""
        ...

    def edits(self, device_ids: Sequence[str]) -> ContainerEdits:
        """What one container gets for these devices together, each device's nodes apart."""
        ...


@dataclass(frozen=True)
class Located:
    """The devices of a family's pairable resource and where they sit on the PCIe tree."""

    resource: str  # "" when the family has nothing to pair now
    devices: Mapping[str, PciLocation | None]


class HealthSink(Protocol):
    """Where a family hands each device's health, on the event loop, as it evaluates it:
    the one path to the log, metrics and the cluster (agents.health_fanout)."""

    def publish(self, states: Iterable[DeviceHealth]) -> None: ...

    def readings(self, resource: str, device: str, values: Mapping[str, float | None]) -> None:
        """One probe's readings of a device's signals for the always-on gauges
        (agents/core/readings.py makes them from a GPU's or a NIC's reading)."""
        ...

    def xid(self, resource: str, device: str, xid: int) -> None:
        """Each XID delivered for a GPU, repeats and application XIDs too, to be counted."""
        ...


@dataclass(frozen=True)
class Context:
    """What a family is built with besides its config sections and what it discovered."""

    backends: Backends
    health: HealthSink
    pairing: PairingSide | None  # None: this family is not paired
    timing: Timing = PRODUCTION  # hold times and probe periods


class Family(Offer, Protocol):
    """A family built from one discovery: its resources and the loop that keeps their
    health (and, for some, their device lists) current."""

    @property
    def name(self) -> str: ...

    def resources(self) -> Sequence[FamilyResource]: ...

    def located(self) -> Located:
        """The devices pairing may use; read when the family is adopted."""
        ...

    def labels(self) -> dict[str, str]:
        """Node labels (names without the prefix) of this family's devices."""
        ...

    def device_health(self) -> list[DeviceHealth]:
        """Every advertised device's health and why, as the cluster is told of it."""
        ...

    def locations(self) -> dict[str, PciLocation]:
        """Where every device of the family sits, whether paired or not (for labels)."""
        ...

    def follow(self, earlier: Family) -> None:
        """Go on from the health `earlier` (the family this one replaces on a reload, now
        ended) knew, so that a device held Unhealthy stays so and the kubelet sees no
        flap. Called on the loop before the family is adopted."""
        ...

    def facts(self) -> FamilyFacts:
        """Each device with its attributes and capacities, tied to the resource (and
        device ID) that serves it; read again whenever a resource's inventory changes."""
        ...

    def edits(
        self, devices: Sequence[DeviceKey], consumed: Consumed | None = None
    ) -> ContainerEdits:
        """What one container gets for these devices (resource, device ID) together;
        `consumed`: what shares of them the claim holds (devices shared, not whole)."""
        ...

    async def run(self) -> None:
        """Keep health current until cancelled; release what discovery took on the way out."""
        ...

    async def close(self) -> None:
        """Release what discovery took, for a family that will never run (a failed reload)."""
        ...


Found = TypeVar("Found")  # what a kind's discovery finds, as plain values


class FamilyKind(Protocol[Found]):
    """How a family is made. `discover` runs off the event loop and returns values only;
    `build` runs on the loop and changes nothing outside the family it returns."""

    name: str
    sections: tuple[str, ...]  # the Config fields it reads; only these reach it
    pairs_as: str | None  # its kind in the GPU<->NIC ledger, or None

    def discover(self, config: Config, backends: Backends, source: str) -> Found:
        """Blocking; `source` names the config in errors. Raises ConfigError or
        BackendError, holding nothing then."""
        ...

    def build(self, found: Found, config: Config, context: Context) -> Family: ...

    def named_devices(self, config: Config) -> Config:
        """`config` as this family runs where devices are claimed one by one by name and
        shared by claims (Serve.names_devices): the keys that mean nothing there set back
        to their defaults, with one warning for each that was set."""
        ...


# Kinds of families together, each with what its own discovery finds.
AnyKind: TypeAlias = "FamilyKind[Any]"


def config_view(kind: AnyKind, config: Config) -> Config:
    """`config` as `kind` sees it: its own sections, every other one at its default. A
    family is built from this view and rebuilt when it changes, so a key a family reads is
    one whose change rebuilds it."""
    return dataclasses.replace(
        Config.default(), **{section: getattr(config, section) for section in kind.sections}
    )
