"""A simulated node: the node file, its sysfs tree, fake NVML and link states, kept in
step with edits of the file (fault injection) while the agent runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TypeVar

import structlog

from agents.errors import ConfigError
from agents.hw.inotify import Change, DirectoryWatch
from agents.hw.lldp import NeighbourSource
from agents.hw.mps_control import MpsControlBinary
from agents.hw.mps_launch import CgroupLaunch, where
from agents.hw.netlink import LinkMonitor, LinkState
from agents.hw.sysfs import Sysfs
from agents.sim.links import SimLinkMonitor
from agents.sim.mps_control import install_twin
from agents.sim.neighbours import SimNeighbourSource
from agents.sim.node import parse_node
from agents.sim.nvml import SimNvml
from agents.sim.specs import NodeSpec
from agents.sim.sysfs_tree import SysfsTree

log = structlog.get_logger(__name__)
T = TypeVar("T")


class SimulatedNode:
    """`load()` once, then `run(stop)` applies every valid edit of the node file."""

    def __init__(
        self,
        node_file: Path,
        root: Path,
        host_links: LinkMonitor | None = None,
        host_lldp: NeighbourSource | None = None,
    ) -> None:
        self.node_file = node_file
        self.tree = SysfsTree(root)
        self.sysfs = Sysfs(self.tree.sys)
        self.version = 0  # edits applied; 1 after load()
        self.rejected = 0  # edits refused (malformed or unreadable)
        self._host_links = host_links
        self._host_lldp = host_lldp
        self._spec: NodeSpec | None = None
        self._text: str | None = None  # the file's text as last applied
        self._nvml: SimNvml | None = None
        self._links: SimLinkMonitor | None = None
        self._neighbours: SimNeighbourSource | None = None
        self.mps: MpsControlBinary | None = None  # the twin, where the node has MPS
        self._applied = asyncio.Event()
        self.watching = asyncio.Event()  # set once run() sees every later edit

    @property
    def dev_root(self) -> Path:
        """Where device nodes live: host_path = str(dev_root) + container_path."""
        return self.tree.dev_root

    @property
    def spec(self) -> NodeSpec:
        return _loaded(self._spec)

    @property
    def nvml(self) -> SimNvml:
        return _loaded(self._nvml)

    @property
    def links(self) -> SimLinkMonitor:
        return _loaded(self._links)

    @property
    def neighbours(self) -> SimNeighbourSource:
        return _loaded(self._neighbours)

    def load(self) -> NodeSpec:
        """Parse the file and build everything; ConfigError when it is malformed."""
        try:
            text = self.node_file.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise ConfigError(
                str(self.node_file), "--simulate", f"a readable node file ({reason})"
            ) from exc
        spec = parse_node(text, str(self.node_file))
        self.tree.apply(spec)
        if spec.mps_available:
            twin = str(install_twin(self.dev_root))
            placed = where()  # in a pod sharing the host's PID namespace: out of its cgroup
            self.mps = MpsControlBinary(
                twin, CgroupLaunch(twin, pid=placed.pid) if placed.host else None
            )
        self._nvml = SimNvml(spec)
        self._links = SimLinkMonitor(spec, self._host_links)
        self._neighbours = SimNeighbourSource(spec, self._host_lldp, self._on_host)
        self._text = text
        self._applied_now(spec)
        return spec

    async def run(self) -> None:
        """Watch the node file until cancelled; apply each valid edit."""
        if self._spec is None:
            self.load()
        with DirectoryWatch(self.node_file.parent, Change.CREATED | Change.WRITTEN) as watch:
            await self.reload()  # an edit made before the watch began
            self.watching.set()
            while True:
                batch = await watch.next_batch()
                if any(event.name == self.node_file.name for event in batch):
                    await self.reload()

    async def reload(self) -> bool:
        """Re-read the file; True when it changed the node. Bad edits change nothing."""
        source = str(self.node_file)
        try:
            text = await asyncio.to_thread(self.node_file.read_text)
            if text == self._text:
                return False  # e.g. the check as run() starts: no edit yet, no parse
            spec = parse_node(text, source)
        except (OSError, ConfigError) as exc:
            self.rejected += 1
            log.warning("node_file_invalid", file=source, error=str(exc))
            return False
        if spec == self._spec:
            self._text = text
            return False
        await asyncio.to_thread(self.tree.apply, spec)
        self.nvml.update(spec)
        self.links.update(spec)
        self.neighbours.update(spec)
        self._text = text
        self._applied_now(spec)
        log.info("node_file_applied", file=source, version=self.version)
        return True

    def _on_host(self, ifname: str) -> bool:
        """Whether the host has this interface (a veth): then its own frames are heard."""
        host = self._host_links
        return host is not None and host.state(ifname) is not LinkState.ABSENT

    async def wait_version(self, version: int) -> None:
        """Wait until at least `version` edits have been applied."""
        while self.version < version:
            await self._applied.wait()

    def _applied_now(self, spec: NodeSpec) -> None:
        self._spec = spec
        self.version += 1
        applied, self._applied = self._applied, asyncio.Event()
        applied.set()


def _loaded(value: T | None) -> T:
    if value is None:
        raise RuntimeError("SimulatedNode.load() has not run")
    return value
