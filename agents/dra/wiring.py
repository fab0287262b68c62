"""DRA mode put together for `node-agent run --api dra`: the node and API server it needs
(both required: its devices are published there), the slice publisher, the claim reads
of prepare, and each driver's checkpoint and CDI specs."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import structlog

from agents.cluster import NODE_NAME_ENV, required_access, this_node
from agents.cluster.client import ApiClient
from agents.dra import shares_note
from agents.dra.capacity import clear_stale_zeros
from agents.dra.claims import (
    Claim,
    ClaimError,
    ClaimNotAllocatedError,
    ClaimNotFoundError,
    ClaimUidMismatchError,
    get_claim,
)
from agents.dra.driver import ClaimRef, ClaimStore
from agents.dra.publisher import SlicePublisher
from agents.dra.runtime import DraRuntime, DraSettings
from agents.errors import ConfigError
from agents.kernel.offer import Offer
from agents.kernel.runtime import Host

log = structlog.get_logger(__name__)

CLAIM_DEADLINE_S = 10.0  # one GET of a claim, well under the kubelet's 45 s per call


class ApiClaims:
    """The claims prepare reads: one GET each, within CLAIM_DEADLINE_S."""

    def __init__(self, client: ApiClient, deadline_s: float = CLAIM_DEADLINE_S) -> None:
        self.client = client
        self._deadline_s = deadline_s

    async def read(self, claim: ClaimRef) -> Claim:
        return await get_claim(
            self.client, claim.namespace, claim.name, claim.uid, self._deadline_s
        )

    async def gone(self, claim: ClaimRef) -> bool | None:
        try:
            await get_claim(self.client, claim.namespace, claim.name, claim.uid, self._deadline_s)
        except (ClaimNotFoundError, ClaimUidMismatchError):
            return True
        except ClaimNotAllocatedError:
            return False  # there, and no longer allocated: the kubelet will unprepare it
        except ClaimError:
            return None
        return False

    async def aclose(self) -> None:
        await self.client.aclose()


class DraServe:
    """Serving through DRA drivers, the node and API server known."""

    names_devices = True

    def __init__(self, settings: DraSettings, client: ApiClient) -> None:
        self.settings = settings
        self.publisher = SlicePublisher(
            settings.node,
            client,
            device_taints=settings.device_taints,
            evict_unhealthy=settings.evict_unhealthy,
            shares_noted=functools.partial(shares_note.record, settings.plugins_dir),
        )
        self.claims = ApiClaims(client)

    def pairing(self) -> None:
        """None: a claim pairs its devices by constraints, which the scheduler meets."""
        return None

    def runtime(self, fresh: Sequence[Offer], host: Host) -> DraRuntime:
        settings = self.settings
        return DraRuntime(
            settings,
            host.families,
            self.publisher,
            self.claims,
            lambda driver: ClaimStore(driver, settings.plugins_dir, settings.cdi_root),
            clear_capacity=functools.partial(clear_stale_zeros, self.claims.client, settings.node),
            withheld=host.withheld,
        )


async def dra_serve(
    settings_of: Callable[[str], DraSettings],
    kubeconfig: Path | None,
    node_name: str | None,
    env: Mapping[str, str],
) -> DraServe:
    """DRA, ready to serve. ConfigError when the node's name or the API server is
    unknown: DRA mode has no use without them."""
    node = this_node(node_name, env)
    if not node:
        raise ConfigError("--api dra", "--node-name", f"this node's name (or env {NODE_NAME_ENV})")
    access = await required_access("--api dra", kubeconfig, env)
    # One pool for slices, claims and the Node; closed by claims.
    return DraServe(settings_of(node), ApiClient(access))
