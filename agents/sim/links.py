"""Link states of a simulated node's NICs: from the node file, or from the host's kernel
when the interface really exists there (e.g. a veth standing in for a NIC)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

from agents.hw.netlink import LinkMonitor, LinkState
from agents.sim.node import NodeSpec


def host_has_interface(ifname: str) -> bool:
    """True when the host's kernel has a network interface of this name."""
    try:
        socket.if_nametoindex(ifname)
    except OSError:
        return False
    return True


class SimLinkMonitor:
    """Implements agents.hw.netlink.LinkMonitor; `update(node)` on reloads. Owns `host`."""

    def __init__(self, node: NodeSpec, host: LinkMonitor | None = None) -> None:
        self._node = node
        self._host = host
        self._changed = asyncio.Event()
        self._on_host: set[str] = set()  # once seen on the host, the host's word holds

    def state(self, ifname: str) -> LinkState:
        if self._host is not None and (ifname in self._on_host or host_has_interface(ifname)):
            self._on_host.add(ifname)
            return self._host.state(ifname)
        nic = self._node.nic_by_netdev(ifname)
        if nic is None:
            return LinkState.ABSENT
        return LinkState.UP if nic.link == "up" else LinkState.DOWN

    def update(self, node: NodeSpec) -> None:
        if node != self._node:
            self._node = node
            self._changed.set()

    async def next_change(self, timeout_s: float) -> bool:
        """Wake on a node reload or on a change the host monitor reports."""
        if self._changed.is_set():
            self._changed.clear()
            return True
        waiters: set[asyncio.Task[bool]] = {asyncio.create_task(self._node_changed())}
        if self._host is not None:
            waiters.add(asyncio.create_task(self._host.next_change(timeout_s)))
        try:
            done, _ = await asyncio.wait(
                waiters, timeout=max(timeout_s, 0.0), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for task in waiters:
                task.cancel()
            for task in waiters:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._changed.clear()
        return any(t.result() for t in done)

    async def _node_changed(self) -> bool:
        await self._changed.wait()
        return True

    def close(self) -> None:
        if self._host is not None:
            self._host.close()
