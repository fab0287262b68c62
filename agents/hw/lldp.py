"""What a NIC hears of its link partner over LLDP (IEEE 802.1AB): the neighbour a frame
names, and the Protocol the RoCE family reads neighbours through (real: raw sockets on
each netdev, agents.hw.lldp_listener; simulated: the node file's `nics[].lldp`)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

ETHERTYPE_LLDP = 0x88CC
NEAREST_BRIDGE = bytes.fromhex("0180c200000e")  # the destination LLDP uses towards a switch


class LldpError(ValueError):
    """A frame that is not a well-formed LLDPDU; it names what is wrong."""


@dataclass(frozen=True)
class Neighbour:
    """The switch port at the other end of a NIC's cable, as its last frame described it."""

    chassis_id: str
    port_id: str
    ttl_s: int  # how long the frame's facts hold; 0 means the neighbour is gone
    system_name: str = ""
    port_description: str = ""

    @property
    def leaf(self) -> str:
        """The leaf switch's name: its system name, else its chassis ID."""
        return self.system_name or self.chassis_id


class NeighbourSource(Protocol):
    """The LLDP neighbour of each watched netdev, kept for as long as its TTL says."""

    def watch(self, ifnames: Iterable[str]) -> None:
        """Listen on exactly these netdevs from now on (the RoCE NICs' own)."""
        ...

    def neighbour(self, ifname: str) -> Neighbour | None:
        """The neighbour heard on `ifname` whose TTL has not run out, or None."""
        ...

    async def next_change(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for a neighbour to appear, change or expire; True if one did."""
        ...

    def close(self) -> None: ...
