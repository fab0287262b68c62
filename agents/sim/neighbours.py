"""LLDP neighbours of a simulated node's NICs: from the node file (`nics[].lldp`), or,
where the netdev really exists on the host (a veth), from the frames heard on it."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from agents.hw.lldp import Neighbour, NeighbourSource
from agents.sim.changes import Changes
from agents.sim.specs import NodeSpec


class SimNeighbourSource:
    """Implements agents.hw.lldp.NeighbourSource; `update(node)` on reloads. Owns `host`.

    `on_host(ifname)` says whether an interface exists on the host (the host link
    monitor knows without a system call); those are listened to by `host`. A neighbour
    in the file holds while the file says so: its ttl is reported, not counted down.
    """

    def __init__(
        self,
        node: NodeSpec,
        host: NeighbourSource | None = None,
        on_host: Callable[[str], bool] = lambda _: False,
    ) -> None:
        self._node = node
        self._host = host
        self._on_host = on_host
        self._watched: tuple[str, ...] = ()
        self._hosted: frozenset[str] = frozenset()  # the watched netdevs the host listens on
        self._changes = Changes(host)

    def watch(self, ifnames: Iterable[str]) -> None:
        self._watched = tuple(ifnames)
        self._hand_over()

    def neighbour(self, ifname: str) -> Neighbour | None:
        if ifname in self._hosted and self._host is not None:
            return self._host.neighbour(ifname)
        if ifname not in self._watched:
            return None
        nic = self._node.nic_by_netdev(ifname)
        found = None if nic is None else nic.lldp
        return None if found is None or found.ttl_s == 0 else found

    def update(self, node: NodeSpec) -> None:
        if node == self._node:
            return
        before = self._heard(self._node)
        self._node = node
        self._hand_over()
        if self._heard(node) != before:
            self._changes.set()

    async def next_change(self, timeout_s: float) -> bool:
        """Wake on an edit of a watched NIC's neighbour, or on one the host hears."""
        return await self._changes.wait(timeout_s)

    def close(self) -> None:
        self._changes.close()
        if self._host is not None:
            self._host.close()

    def _hand_over(self) -> None:
        """Give the host the watched netdevs that exist there (a veth made meanwhile too)."""
        if self._host is None:
            return
        hosted = frozenset(i for i in self._watched if self._on_host(i))
        if hosted != self._hosted:
            self._hosted = hosted
            self._host.watch(sorted(hosted))
            self._changes.set()

    def _heard(self, node: NodeSpec) -> dict[str, Neighbour | None]:
        out: dict[str, Neighbour | None] = {}
        for ifname in self._watched:
            nic = node.nic_by_netdev(ifname)
            out[ifname] = None if nic is None else nic.lldp
        return out
