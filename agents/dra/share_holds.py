"""What a driver tells its family of the shares it prepares (agents.kernel.facts.SharesHeld):
every device that holds a share, before a new share is recorded (a share the family cannot
serve fails its claim) and after shares go (at unprepare, at start, after a reload)."""

from __future__ import annotations

from collections.abc import Mapping

import structlog

from agents.dra.claim_checkpoint import PreparedClaim
from agents.dra.claims import ClaimError
from agents.errors import BackendError
from agents.kernel.edits import DeviceKey
from agents.kernel.facts import SharesHeld

log = structlog.get_logger(__name__)


class ShareHolds:
    """One driver's; used from the event loop, under the driver's lock."""

    def __init__(self, driver: str) -> None:
        self.driver = driver
        self.family: SharesHeld | None = None  # None: its family needs nothing done

    async def hold(self, claims: Mapping[str, PreparedClaim], fresh: PreparedClaim) -> None:
        """`claims` (`fresh` among them) about to be prepared: ClaimError, nothing changed,
        when the family cannot serve `fresh`'s shares. Whole devices tell it nothing."""
        new = shares({"": fresh})
        if self.family is None or not new:
            return
        try:
            await self.family(shares(claims), new)
        except BackendError as exc:
            raise ClaimError(f"shares not served: {exc}") from exc

    async def settle(self, claims: Mapping[str, PreparedClaim]) -> None:
        """The family told which devices hold shares now; a failure is only logged."""
        if self.family is None:
            return
        try:
            await self.family(shares(claims), frozenset())
        except BackendError as exc:
            log.warning("dra_shares_unsettled", driver=self.driver, error=str(exc))


def shares(claims: Mapping[str, PreparedClaim]) -> frozenset[DeviceKey]:
    """The devices (resource, device ID) the claims hold shares of."""
    return frozenset(
        (d.resource, d.device_id) for c in claims.values() for d in c.devices if d.share_id
    )
