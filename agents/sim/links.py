"""Link states of a simulated node's NICs: from the node file, or from the host's kernel
when the interface really exists there (e.g. a veth standing in for a NIC)."""

from __future__ import annotations

import asyncio

from agents.errors import BackendError
from agents.hw.netlink import LinkMonitor, LinkState
from agents.sim.node import NodeSpec

HOST_WAIT_S = 3600.0  # the host follower's wait; it wakes only for real changes


class SimLinkMonitor:
    """Implements agents.hw.netlink.LinkMonitor; `update(node)` on reloads. Owns `host`.

    Host changes are followed by one long-lived task, started by the first next_change(),
    so that each wait costs one timer rather than a task per source.
    """

    def __init__(self, node: NodeSpec, host: LinkMonitor | None = None) -> None:
        self._node = node
        self._host = host
        self._changed = asyncio.Event()
        self._taken = asyncio.Event()  # a waiter took the last change
        self._on_host: set[str] = set()  # once seen on the host, the host's word holds
        self._follower: asyncio.Task[None] | None = None
        self._host_error: BackendError | None = None

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
            self._changed.set()

    async def next_change(self, timeout_s: float) -> bool:
        """Wake on a node reload or on a change the host monitor reports."""
        if self._host is not None and self._follower is None:
            self._follower = asyncio.create_task(self._follow(self._host))
        if not self._changed.is_set():
            try:
                async with asyncio.timeout(max(timeout_s, 0.0)):
                    await self._changed.wait()
            except TimeoutError:
                return False
        if self._host_error is not None:
            raise self._host_error
        self._changed.clear()
        self._taken.set()
        return True

    async def _follow(self, host: LinkMonitor) -> None:
        try:
            while True:
                if await host.next_change(HOST_WAIT_S):
                    self._taken.clear()
                    self._changed.set()
                    await self._taken.wait()  # later changes gather in the host meanwhile
        except BackendError as exc:
            self._host_error = exc
            self._changed.set()

    def close(self) -> None:
        if self._follower is not None and not self._follower.done():
            self._follower.cancel()
        if self._host is not None:
            self._host.close()
