"""Link states of a simulated node's NICs: from the node file, or from the host's kernel
when the interface really exists there (e.g. a veth standing in for a NIC)."""

from __future__ import annotations

from agents.hw.netlink import LinkMonitor, LinkState
from agents.sim.changes import Changes
from agents.sim.specs import NodeSpec


class SimLinkMonitor:
    """Implements agents.hw.netlink.LinkMonitor; `update(node)` on reloads. Owns `host`."""

    def __init__(self, node: NodeSpec, host: LinkMonitor | None = None) -> None:
        self._node = node
        self._host = host
        self._changes = Changes(host)
        self._on_host: set[str] = set()  # once seen on the host, the host's word holds

    def state(self, ifname: str) -> LinkState:
        if self._host is not None:
            # The host monitor knows every host interface: asking it costs no system call.
            host = self._host.state(ifname)
            if host is not LinkState.ABSENT or ifname in self._on_host:
                self._on_host.add(ifname)
                return host
        nic = self._node.nic_by_netdev(ifname)
        if nic is None:
            return LinkState.ABSENT
        return LinkState.UP if nic.link == "up" else LinkState.DOWN

    def update(self, node: NodeSpec) -> None:
        if node != self._node:
            self._node = node
            self._changes.set()

    async def next_change(self, timeout_s: float) -> bool:
        """Wake on a node reload or on a change the host monitor reports."""
        return await self._changes.wait(timeout_s)

    def close(self) -> None:
        self._changes.close()
        if self._host is not None:
            self._host.close()
