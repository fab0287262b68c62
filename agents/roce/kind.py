"""How the RoCE family is made: NICs read from sysfs off the event loop, then built."""

from __future__ import annotations

from agents.backends import Backends
from agents.config import Config
from agents.core.ledger import NIC
from agents.family import Context
from agents.roce.family import NicsFound, RoceFamily, discover_nics


class RoceKind:
    name = "roce"
    sections: tuple[str, ...] = ("roce", "pairing")
    pairs_as: str | None = NIC

    def discover(self, config: Config, backends: Backends, source: str) -> NicsFound:
        return discover_nics(backends.sysfs, config)

    def build(self, found: NicsFound, config: Config, context: Context) -> RoceFamily:
        b = context.backends
        return RoceFamily(
            b.sysfs,
            b.links,
            found,
            config,
            dev_root="" if b.dev_root is None else str(b.dev_root),
            health=context.health,
            pairing=context.pairing,
        )
