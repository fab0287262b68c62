"""An API the agent serves its families through, as the agent meets it: `Api` is read
from the command line (agents/apis.py lists them), the `Serve` it gives makes the
runtime, and the runtime serves the families to the kubelet until cancelled."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from agents.core.ledger import PairingSide
from agents.core.topology import PciLocation
from agents.kernel.handover import Holdings
from agents.kernel.offer import Offer
from agents.kernel.telemetry import NoTelemetry, Telemetry

if TYPE_CHECKING:
    from agents.config import Config


class Runtime(Protocol):
    """Serves the families' devices to the kubelet through one API."""

    def check(self, offers: Sequence[Offer]) -> None:
        """Raise ConfigError if these families could not be served (before a reload)."""
        ...

    async def replace(self, offers: Sequence[Offer], unchanged: Collection[str]) -> None:
        """Serve these families from now on; `unchanged` names the resources whose
        definition stayed the same."""
        ...

    async def run(self) -> None: ...

    def serving(self) -> bool: ...


@dataclass(frozen=True)
class Host:
    """What the agent gives a runtime it makes."""

    families: Callable[[], Sequence[Offer]]  # the agent's families, once adopted
    config: Callable[[], Config]  # the agent's config as it is now (after any reload)
    telemetry: Telemetry = field(default_factory=NoTelemetry)
    withheld: Holdings | None = None  # what another API's pods or claims still hold


class Pairs(Protocol):
    """GPU<->NIC pairing, as an API that pairs makes it: the agent gives each paired
    family a side, says where their devices are, and runs it beside the runtime."""

    @property
    def active(self) -> bool:
        """Both kinds have a resource with located devices."""
        ...

    def side(self, kind: str) -> PairingSide: ...

    def located(
        self, kind: str, resource: str, locations: Mapping[str, PciLocation | None]
    ) -> None: ...

    def withdraw(self, kind: str) -> None:
        """Pairing is switched off for this kind (a reloaded config)."""
        ...

    def start(self, resources: Mapping[str, str]) -> bool:
        """The families have started (`resources`: every resource name -> what its
        devices are): say once what is paired and what is not. True when pairing is on."""
        ...

    async def run(self) -> None: ...

    async def close(self) -> None: ...


class Serve(Protocol):
    """One API, ready to serve: what the agent must know of it, and its runtime's maker."""

    def pairing(self) -> Pairs | None:
        """The GPU<->NIC pairing of this API, where its runtime pairs (asked once, when
        the agent runs families of both kinds); None where it does not."""
        ...

    @property
    def names_devices(self) -> bool:
        """Whether devices are claimed one by one by name (no replicas, no sharing keys):
        families are configured so (FamilyKind.named_devices)."""
        ...

    def runtime(self, fresh: Sequence[Offer], host: Host) -> Runtime:
        """The runtime over `fresh` families (not yet adopted); later it reads
        `host.families`."""
        ...


class Api(Protocol):
    """One kubelet API: its name for `--api`, its flags, and how it is made from them."""

    name: str

    def add_flags(self, run: argparse.ArgumentParser) -> None: ...

    def flags_error(self, opts: argparse.Namespace) -> str | None:
        """What is wrong with this API's flags as given (a usage error), if anything."""
        ...

    async def serve(self, opts: argparse.Namespace, env: Mapping[str, str]) -> Serve:
        """Ready to serve; ConfigError if the command line lacks what it needs."""
        ...

    def leftovers(self, opts: argparse.Namespace) -> Holdings:
        """What this API's pods or claims still hold while another API serves."""
        ...
