"""The agent process: backends and families built from the config, run with the runtime."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import structlog

from agents.config import Config
from agents.core.ledger import GPU, NIC
from agents.core.node_report import DeviceHealth
from agents.errors import ConfigError
from agents.gpu.family import GpuFamily
from agents.gpu.resource import GpuResource
from agents.hw.netlink import LinkMonitor, LinkState
from agents.hw.nvml import Nvml
from agents.hw.sysfs import Sysfs
from agents.loops import Loops
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
    from agents.hw.netlink import NetlinkMonitor
    from agents.hw.nvml_backend import NvmlBackend

    return Backends(NvmlBackend(), Sysfs(), NetlinkMonitor())


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
    from agents.hw.netlink import NetlinkMonitor
    from agents.sim.root import sim_root
    from agents.sim.simnode import SimulatedNode  # the simulator: only for --simulate

    # Ours to close: the RoCE family closes its links when it ends, but a GPU-only
    # agent, or a node file that fails to load, never hands them to one.
    host_links = NetlinkMonitor()
    try:
        with sim_root(root_parent, sim_root_parent()) as root:
            node = SimulatedNode(node_file, root, host_links=host_links)
            node.load()
            yield Backends(node.nvml, node.sysfs, node.links, node.dev_root, node)
    finally:
        host_links.close()


class HealthReporter(Protocol):
    """Told of every health change on the event loop (it must not block), and run beside
    the device plugins with the current health of every advertised device at hand."""

    def changed(self, change: DeviceHealth) -> None: ...

    async def run(self, stop: asyncio.Event, current: Callable[[], list[DeviceHealth]]) -> None: ...


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
    pod_resources_socket: Path | None = None
    reporter: HealthReporter | None = None

    def __post_init__(self) -> None:
        self.family_objects: list[Family] = []
        self.manager: PluginManager | None = None
        self.gpu: GpuFamily | None = None
        self.roce: RoceFamily | None = None
        # One pairing for the agent's life: the kubelet's facts outlive a config reload.
        self.pairing: Pairing | None = None
        if {"gpu", "roce"} <= set(self.families):
            facts = CheckpointFile(self.plugin_dir), PodResources(self.pod_resources_socket)
            self.pairing = Pairing(*facts)
        self.metrics: Metrics | None = None
        self.metrics_server: MetricsServer | None = None  # its port is the bound one
        self._loops = Loops()
        self._reloading = asyncio.Lock()
        if self.metrics_address is not None:
            from agents.metrics import Metrics, MetricsServer  # prometheus_client: only if asked

            self.metrics = Metrics()
            self.telemetry = self.metrics
            self.metrics_server = MetricsServer(self.metrics, self.metrics_address, self.serving)

    def start(self) -> PluginManager:
        """Discover devices and plan resources. Raises ConfigError or BackendError."""
        for name in self.families:
            self._adopt(self._family(name, self.config))
        self._say_pairing()
        self.manager = PluginManager(
            self.plugin_dir,
            self.resources(),
            telemetry=self.telemetry,
            before_preferred=self.pairing.refresh if self.pairing is not None else None,
        )
        if self.metrics is not None:
            self.metrics.watch_resources(self.resources)
        return self.manager

    def _family(self, name: str, config: Config) -> Family:
        """A started family of `config`. Raises ConfigError or BackendError."""
        b = self.backends
        family: Family
        side = None
        if self.pairing is not None:
            kind = GPU if name == "gpu" else NIC
            if config.pairing.enabled:
                side = self.pairing.side(kind)
            else:
                self.pairing.withdraw(kind)
        if name == "gpu":
            family = GpuFamily(
                b.nvml,
                b.sysfs,
                config,
                config_source=self.config_source,
                dev_root=b.dev_root,
                telemetry=self.telemetry,
                pairing=side,
                on_health=self._on_health,
            )
        else:
            links = _Borrowed(b.links)  # the agent closes them, not a replaced family
            family = RoceFamily(
                b.sysfs,
                links,
                config,
                dev_root=b.dev_root,
                telemetry=self.telemetry,
                pairing=side,
                on_health=self._on_health,
            )
        family.start()
        if not any(r.inventory.devices for r in family.resources()):
            log.info("family_without_devices", family=name, effect="registers nothing")
        return family

    def _adopt(self, family: Family) -> None:
        self.family_objects = [f for f in self.family_objects if f.name != family.name]
        self.family_objects.append(family)
        if isinstance(family, GpuFamily):
            self.gpu = family
        elif isinstance(family, RoceFamily):
            self.roce = family

    def resources(self) -> list[Resource]:
        return [r for f in self.family_objects for r in f.resources()]

    @property
    def _on_health(self) -> Callable[[DeviceHealth], None] | None:
        return None if self.reporter is None else self.reporter.changed

    def device_health(self) -> list[DeviceHealth]:
        """Every advertised device's health and its cause, over all families."""
        return [state for f in self.family_objects for state in f.device_health()]

    def serving(self) -> bool:
        """Liveness: every resource's server is up."""
        return self.manager is not None and self.manager.serving()

    async def reload(self, config: Config) -> None:
        """Apply a new config: families whose settings changed are built anew, and only
        resources whose definition changed register again. Raises ConfigError or
        BackendError (and changes nothing) when the new config cannot be applied."""
        async with self._reloading:
            manager = self.manager or self.start()
            old = self.config
            if config == old:
                log.info("config_unchanged", source=self.config_source)
                return
            changed = [n for n in self.families if settings(n, old) != settings(n, config)]
            before = {r.name: definition(r, old) for r in self.resources()}
            # Discovery blocks (NVML, sysfs): off the loop. It may raise; nothing is changed yet.
            fresh = await asyncio.to_thread(lambda: [self._family(n, config) for n in changed])
            for family in fresh:
                await self._loops.end(family.name)
                self._adopt(family)
            self.config = config
            self._say_pairing()
            now = self.resources()
            unchanged = {r.name for r in now if before.get(r.name) == definition(r, config)}
            await manager.replace(now, unchanged)
            for family in fresh:
                self._loops.begin(family.name, family.run)
            self._restart_labels()
            log.info(
                "config_reloaded",
                source=self.config_source,
                families=changed,
                changed=sorted(r.name for r in now if r.name not in unchanged),
                withdrawn=sorted(set(before) - {r.name for r in now}),
            )

    def _say_pairing(self) -> None:
        """Log what is paired and what is not (after a start or a reload)."""
        if self.pairing is not None:
            self.pairing.start({r.name: _what(r) for r in self.resources()})

    def _restart_labels(self) -> None:
        """(Re)start the node-label loop on the current families."""
        if self.nfd_features_file is None:
            return
        from agents.labels import keep_labels

        path, gpu, roce = self.nfd_features_file, self.gpu, self.roce
        self._loops.replace("labels", lambda stop: keep_labels(path, gpu, roce, stop))

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set; any task failing stops the rest and is raised."""
        manager = self.manager or self.start()
        coros = [manager.run(stop)]
        if self.pairing is not None:
            coros.append(self.pairing.run(stop))
        if self.backends.simulated is not None:
            coros.append(self.backends.simulated.run(stop))
        if self.metrics_server is not None:
            coros.append(self.metrics_server.serve(stop))
        if self.reporter is not None:
            coros.append(self.reporter.run(stop, self.device_health))
        for family in self.family_objects:
            self._loops.begin(family.name, family.run)
        self._restart_labels()
        coros.append(self._loops.supervise(stop))
        tasks = [asyncio.ensure_future(c) for c in coros]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                if task.exception() is not None:
                    stop.set()
                    raise task.exception()  # type: ignore[misc]
        finally:
            stop.set()
            await self._loops.end_all()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.backends.links.close()
            if self.pairing is not None:
                await self.pairing.close()


def _what(resource: Resource) -> str:
    """How pairing sees a resource, for its log."""
    if not isinstance(resource, GpuResource):
        return "NICs"
    return "whole GPUs" if resource.whole_gpus else "shared or MIG GPUs"


def settings(family: str, config: Config) -> object:
    """The part of `config` a family is built from: a family is rebuilt when it changes."""
    if family == "gpu":
        return config.flags, config.sharing, config.health, config.pairing
    return config.roce, config.pairing


def definition(resource: Resource, config: Config) -> object:
    """What the kubelet and its containers see of a resource, health aside: when this
    changes on reload, the resource registers again."""
    devices = tuple((d.id, d.numa) for d in resource.inventory.devices)
    allocation: object = ()
    if isinstance(resource, GpuResource):
        slicing = config.sharing.time_slicing
        allocation = config.flags, slicing.fail_requests_greater_than_one
    return type(resource).__name__, resource.name, devices, allocation


class _Borrowed:
    """The agent's link monitor as a family sees it: a family replaced on reload must not
    close what its successor reads. The agent closes the monitor when it ends."""

    def __init__(self, links: LinkMonitor) -> None:
        self._links = links

    def state(self, ifname: str) -> LinkState:
        return self._links.state(ifname)

    async def next_change(self, timeout_s: float) -> bool:
        return await self._links.next_change(timeout_s)

    def close(self) -> None:
        """Nothing: the monitor is the agent's."""
