"""The agent process: backends and families built from the config, run with the runtime."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from agents.config import Config
from agents.core.ledger import GPU, NIC
from agents.errors import ConfigError
from agents.gpu.family import GpuFamily
from agents.gpu.resource import GpuResource
from agents.hw.netlink import LinkMonitor
from agents.hw.nvml import Nvml
from agents.hw.sysfs import Sysfs
from agents.pairing import Pairing
from agents.plugin.family import Family
from agents.plugin.kubelet_facts import CheckpointFile, PodResources
from agents.plugin.manager import PluginManager
from agents.plugin.resource import Resource
from agents.plugin.telemetry import NoTelemetry, Telemetry
from agents.roce.family import RoceFamily

if TYPE_CHECKING:
    from agents.metrics import Metrics, MetricsServer
    from agents.sim.simnode import SimulatedNode

log = structlog.get_logger(__name__)

FAMILIES = ("gpu", "roce")
MEMORY_TMP = Path("/dev/shm")  # tmpfs wherever POSIX shared memory works


@dataclass
class Backends:
    """Everything the families read the node through."""

    nvml: Nvml
    sysfs: Sysfs
    links: LinkMonitor
    dev_root: Path | None = None  # where device nodes live; None = the host's /
    simulated: SimulatedNode | None = None


def real_backends(config: Config) -> Backends:
    from agents.core.xid import APPLICATION_XIDS
    from agents.hw.netlink import NetlinkMonitor
    from agents.hw.nvml_backend import NvmlBackend

    ignored = APPLICATION_XIDS | config.health.disabled_xids
    return Backends(NvmlBackend(ignored_xids=ignored), Sysfs(), NetlinkMonitor())


def sim_root_parent() -> str | None:
    """Where a simulated node's tree goes: a memory filesystem when one is writable here,
    else (None) the temporary directory. The tree stands in for /sys, itself in memory;
    on a busy disk creating its hundreds of tiny files can take a second of the start."""
    if MEMORY_TMP.is_dir() and os.access(MEMORY_TMP, os.W_OK | os.X_OK):
        return str(MEMORY_TMP)
    return None


@contextlib.asynccontextmanager
async def simulated_backends(node_file: Path) -> AsyncIterator[Backends]:
    """A simulated node materialised in a temporary root for as long as the context lasts."""
    from agents.hw.netlink import NetlinkMonitor
    from agents.sim.simnode import SimulatedNode  # the simulator: only for --simulate

    # Ours to close: the RoCE family closes its links when it ends, but a GPU-only
    # agent, or a node file that fails to load, never hands them to one.
    host_links = NetlinkMonitor()
    try:
        with tempfile.TemporaryDirectory(prefix="node-agent-sim-", dir=sim_root_parent()) as root:
            node = SimulatedNode(node_file, Path(root), host_links=host_links)
            node.load()
            yield Backends(node.nvml, node.sysfs, node.links, node.dev_root, node)
    finally:
        host_links.close()


def _what(resource: Resource) -> str:
    """How pairing sees a resource, for its log."""
    if not isinstance(resource, GpuResource):
        return "NICs"
    return "whole GPUs" if resource.whole_gpus else "shared or MIG GPUs"


def parse_families(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = [n for n in names if n not in FAMILIES]
    if unknown or not names:
        raise ConfigError("--families", ",".join(unknown) or text, f"any of {', '.join(FAMILIES)}")
    return names


@dataclass
class Agent:
    config: Config
    config_source: str
    plugin_dir: Path
    backends: Backends
    families: Sequence[str] = FAMILIES
    telemetry: Telemetry = field(default_factory=NoTelemetry)
    metrics_address: str | None = None
    nfd_features_file: Path | None = None
    pod_resources_socket: Path | None = None  # the kubelet's pod-resources API, if reachable

    def __post_init__(self) -> None:
        self.family_objects: list[Family] = []
        self.manager: PluginManager | None = None
        self.gpu: GpuFamily | None = None
        self.roce: RoceFamily | None = None
        self.pairing: Pairing | None = None
        self.metrics: Metrics | None = None
        self.metrics_server: MetricsServer | None = None  # its port is the bound one
        if self.metrics_address is not None:
            from agents.metrics import Metrics, MetricsServer  # prometheus_client: only if asked

            self.metrics = Metrics()
            self.telemetry = self.metrics
            self.metrics_server = MetricsServer(self.metrics, self.metrics_address, self.serving)

    def start(self) -> PluginManager:
        """Discover devices and plan resources. Raises ConfigError or BackendError."""
        b = self.backends
        pairing = (
            Pairing(CheckpointFile(self.plugin_dir), PodResources(self.pod_resources_socket))
            if self.config.pairing.enabled and {"gpu", "roce"} <= set(self.families)
            else None
        )
        if "gpu" in self.families:
            gpu = GpuFamily(
                b.nvml,
                b.sysfs,
                self.config,
                config_source=self.config_source,
                dev_root=b.dev_root,
                telemetry=self.telemetry,
                pairing=pairing.side(GPU) if pairing is not None else None,
            )
            gpu.start()
            self.gpu = gpu
            self.family_objects.append(gpu)
        if "roce" in self.families:
            roce = RoceFamily(
                b.sysfs,
                b.links,
                self.config,
                dev_root=b.dev_root,
                telemetry=self.telemetry,
                pairing=pairing.side(NIC) if pairing is not None else None,
            )
            roce.start()
            self.roce = roce
            self.family_objects.append(roce)
        resources: list[Resource] = [r for f in self.family_objects for r in f.resources()]
        prepare = {}
        if pairing is not None:
            self.pairing = pairing
            kinds = {r.name: _what(r) for f in self.family_objects for r in f.resources()}
            pairing.start(kinds)
            prepare = {name: pairing.refresh for name in pairing.resources().values()}
        self.manager = PluginManager(
            self.plugin_dir, resources, telemetry=self.telemetry, before_preferred=prepare
        )
        if self.metrics is not None:
            self.metrics.watch_resources(lambda: resources)
        return self.manager

    def serving(self) -> bool:
        """Liveness: every resource's server is up."""
        return self.manager is not None and all(s.serving for s in self.manager.servers.values())

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set; any task failing stops the rest and is raised."""
        manager = self.manager or self.start()
        coros = [manager.run(stop), *(f.run(stop) for f in self.family_objects)]
        if self.pairing is not None:
            coros.append(self.pairing.run(stop))
        if self.backends.simulated is not None:
            coros.append(self.backends.simulated.run(stop))
        if self.nfd_features_file is not None:
            from agents.labels import keep_labels

            coros.append(keep_labels(self.nfd_features_file, self.gpu, self.roce, stop))
        if self.metrics_server is not None:
            coros.append(self.metrics_server.serve(stop))
        tasks = [asyncio.ensure_future(c) for c in coros]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if task.exception() is not None:
                    stop.set()
                    raise task.exception()  # type: ignore[misc]
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.pairing is not None:
                await self.pairing.close()
