"""What the families read the node through: the real hardware, or a simulated node."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agents.errors import BackendError
from agents.hw.mps_control import MpsControl, MpsControlBinary
from agents.hw.nvml import Nvml
from agents.hw.sysfs import Sysfs

if TYPE_CHECKING:
    from agents.hw.lldp import NeighbourSource
    from agents.hw.netlink import LinkMonitor, LinkState
    from agents.sim.simnode import SimulatedNode

MEMORY_TMP = Path("/dev/shm")  # tmpfs wherever POSIX shared memory works


@dataclass
class Backends:
    """Everything the families read the node through. The agent owns them: a family
    replaced on reload never closes what its successor reads."""

    nvml: Nvml
    sysfs: Sysfs
    links: LinkMonitor
    dev_root: Path | None = None  # where device nodes live; None = the host's /
    simulated: SimulatedNode | None = None
    lldp: NeighbourSource | None = None  # None: no LLDP is listened to
    mps: MpsControl | None = None  # None: no MPS control program on this node
    # The host's /proc (NVML names processes by host PID); a simulated node has its own.
    proc_root: Path = Path("/proc")


class LinksOnFirstUse:
    """A LinkMonitor opened when a link is first asked about: a node whose families read
    no link (GPUs alone) keeps no netlink socket, and no link change on the host (a pod's
    veth coming or going) wakes its event loop."""

    def __init__(self, opener: Callable[[], LinkMonitor] | None = None) -> None:
        self._opener = opener or _netlink_monitor
        self._monitor: LinkMonitor | None = None
        self._closed = False

    @property
    def opened(self) -> bool:
        return self._monitor is not None

    def state(self, ifname: str) -> LinkState:
        return self._opened().state(ifname)

    async def next_change(self, timeout_s: float) -> bool:
        return await self._opened().next_change(timeout_s)

    def close(self) -> None:
        self._closed = True
        if self._monitor is not None:
            self._monitor.close()

    def _opened(self) -> LinkMonitor:
        if self._closed:
            raise BackendError("netlink monitor is closed")
        if self._monitor is None:
            self._monitor = self._opener()
        return self._monitor


def _netlink_monitor() -> LinkMonitor:
    from agents.hw.netlink import NetlinkMonitor

    return NetlinkMonitor()


def real_backends() -> Backends:
    from agents.hw.lldp_listener import LldpListener
    from agents.hw.nvml_backend import NvmlBackend

    mps = MpsControlBinary.find()
    return Backends(NvmlBackend(), Sysfs(), LinksOnFirstUse(), lldp=LldpListener(), mps=mps)


def sim_root_parent() -> str | None:
    """Where a simulated node's tree goes: a memory filesystem when one is writable here,
    else (None) the temporary directory. The tree stands in for /sys, itself in memory;
    on a busy disk creating its hundreds of tiny files can take a second of the start."""
    if MEMORY_TMP.is_dir() and os.access(MEMORY_TMP, os.W_OK | os.X_OK):
        return str(MEMORY_TMP)
    return None


@contextlib.asynccontextmanager
async def simulated_backends(
    node_file: Path, root_parent: Path | None = None
) -> AsyncIterator[Backends]:
    """A simulated node materialised for as long as the context lasts: in a temporary root,
    or in the agent's own subtree of `root_parent` (--simulate-root)."""
    from agents.hw.lldp_listener import LldpListener
    from agents.hw.netlink import NetlinkMonitor
    from agents.sim.root import sim_root
    from agents.sim.simnode import SimulatedNode  # the simulator: only for --simulate

    # Ours to close: the simulated links and neighbours follow the host's (veth in tests).
    host_links, host_lldp = NetlinkMonitor(), LldpListener()
    try:
        with sim_root(root_parent, sim_root_parent()) as root:
            node = SimulatedNode(node_file, root, host_links=host_links, host_lldp=host_lldp)
            node.load()
            yield Backends(
                node.nvml,
                node.sysfs,
                node.links,
                node.dev_root,
                node,
                lldp=node.neighbours,
                mps=node.mps,
                proc_root=root / "proc",
            )
    finally:
        host_links.close()
        host_lldp.close()
