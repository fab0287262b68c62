"""How the RoCE family is made: NICs read from sysfs off the event loop, then built."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import structlog

from agents.backends import Backends
from agents.config import Config, Roce
from agents.core.ledger import NIC
from agents.family import Context

if TYPE_CHECKING:  # the family itself is loaded only where it runs (not under --families gpu)
    from agents.roce.family import NicsFound, RoceFamily

log = structlog.get_logger(__name__)


class RoceKind:
    name = "roce"
    sections: tuple[str, ...] = ("roce", "pairing", "fabric", "health")
    pairs_as: str | None = NIC

    def discover(self, config: Config, backends: Backends, source: str) -> NicsFound:
        from agents.roce.family import discover_nics

        return discover_nics(backends.sysfs, config)

    def named_devices(self, config: Config) -> Config:
        """Under DRA the NICs are the driver's devices, not a named resource: a configured
        resourceName is ignored, with a warning."""
        if config.roce.resource_name == Roce().resource_name:
            return config
        log.warning("dra_ignores_key", key="roce.resourceName", family=self.name)
        roce = dataclasses.replace(config.roce, resource_name=Roce().resource_name)
        return dataclasses.replace(config, roce=roce)

    def build(self, found: NicsFound, config: Config, context: Context) -> RoceFamily:
        from agents.roce.family import RoceFamily

        b = context.backends
        return RoceFamily(
            b.sysfs,
            b.links,
            found,
            config,
            dev_root="" if b.dev_root is None else str(b.dev_root),
            health=context.health,
            pairing=context.pairing,
            lldp=b.lldp,
            timing=context.timing,
        )
