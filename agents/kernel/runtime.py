"""An API the agent serves its families through, as the agent meets it: `Api` is read
from the command line (agents/apis.py lists them), the `Serve` it gives makes the
runtime, and the runtime serves the families to the kubelet until cancelled."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agents.kernel.handover import Holdings
from agents.kernel.offer import Offer
from agents.kernel.telemetry import NoTelemetry, Telemetry


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
    plugin_dir: Path  # the kubelet's device-plugin directory
    telemetry: Telemetry = field(default_factory=NoTelemetry)
    # Facts to gather before a preferred allocation (pairing's pod-resources refresh).
    before_preferred: Callable[[str], Awaitable[None]] | None = None
    withheld: Holdings | None = None  # what another API's pods or claims still hold


class Serve(Protocol):
    """One API, ready to serve: what the agent must know of it, and its runtime's maker."""

    @property
    def pairs(self) -> bool:
        """Whether its runtime asks for preferred allocations, which pairing answers."""
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

    async def serve(self, opts: argparse.Namespace, env: Mapping[str, str]) -> Serve:
        """Ready to serve; ConfigError if the command line lacks what it needs."""
        ...

    def leftovers(self, opts: argparse.Namespace) -> Holdings:
        """What this API's pods or claims still hold while another API serves."""
        ...
