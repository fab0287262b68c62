"""The link-state Protocol the RoCE family uses, and the real netlink backend (pyroute2)."""

from __future__ import annotations

import enum
from typing import Protocol


class LinkState(enum.Enum):
    UP = "up"
    DOWN = "down"  # admin down or no carrier
    ABSENT = "absent"  # no such interface


class LinkMonitor(Protocol):
    """Link state of network interfaces, with changes pushed by the kernel."""

    def state(self, ifname: str) -> LinkState: ...

    async def next_change(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for a link change; True if one (may have) happened."""
        ...

    def close(self) -> None: ...
