"""The agent process: families built from the config and served through one kubelet API
(agents/apis.py), with that API's pairing, health fan-out, labels, metrics and cluster
reports beside them.

Discovery runs off the event loop and returns values; everything live (families,
pairing, resources) changes on the loop, only once a start or reload can no longer fail.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, TypeVar

import structlog

from agents.backends import Backends
from agents.config import Config
from agents.core.health import DeviceHealth
from agents.core.ledger import GPU, NIC, PAIRED_KINDS
from agents.core.topology import pairs_label
from agents.families import KINDS
from agents.family import AnyKind, Context, Family, FamilyResource, config_view
from agents.health_fanout import HealthFanout
from agents.kernel.handover import Holdings, Together
from agents.kernel.runtime import Host, Pairs, Runtime, Serve
from agents.kernel.telemetry import NoTelemetry, Telemetry
from agents.tasks import Job, Supervisor, cause, off_loop, until
from agents.timing import PRODUCTION, Timing

if TYPE_CHECKING:
    from agents.cluster.node_labeller import NodeLabeller
    from agents.holders import DeviceHolders
    from agents.metrics import Metrics, MetricsServer

log = structlog.get_logger(__name__)

F = TypeVar("F")


class HealthReporter(Protocol):
    """Told of every health change on the event loop (it must not block), and run beside
    the runtime with the current health of every advertised device at hand."""

    def changed(self, change: DeviceHealth) -> None: ...

    async def run(self, current: Callable[[], list[DeviceHealth]]) -> None: ...


@dataclass
class Agent:
    config: Config
    config_source: str
    api: Serve  # the API the families are served through (agents/apis.py)
    backends: Backends
    kinds: Sequence[AnyKind] = KINDS
    telemetry: Telemetry = field(default_factory=NoTelemetry)
    metrics_address: str | None = None
    nfd_features_file: Path | None = None
    reporter: HealthReporter | None = None
    # What pods or claims of the other APIs still hold: not offered until freed.
    leftovers: Sequence[Holdings] = ()
    # --label-node: the fabric's labels patched onto this node's Node.
    node_labeller: NodeLabeller | None = None
    timing: Timing = PRODUCTION  # the production hold times and probe periods; tests shorten them
    # With metrics: which pod holds each device, from the kubelet's pod-resources API.
    pod_resources_socket: Path | None = None

    def __post_init__(self) -> None:
        self.families: dict[str, Family] = {}  # by kind name, in the order of `kinds`
        self.manager: Runtime | None = None
        # Where the API pairs and families of both kinds run: one for the agent's life.
        self.pairing: Pairs | None = None
        if {k.pairs_as for k in self.kinds} >= PAIRED_KINDS:
            self.pairing = self.api.pairing()
        self.metrics: Metrics | None = None
        self.metrics_server: MetricsServer | None = None  # its port is the bound one
        self.holders: DeviceHolders | None = None
        if self.metrics_address is not None:
            from agents.metrics import Metrics, MetricsServer  # imported only if asked

            self.metrics = Metrics()
            self.telemetry = self.metrics
            self.metrics_server = MetricsServer(self.metrics, self.metrics_address, self.serving)
            if self.pod_resources_socket is not None:
                self.holders = self._holders(self.metrics, self.pod_resources_socket)
            from agents.label_metric import LabelCollector

            self.metrics.registry.register(LabelCollector(self.labels))
        changed = None if self.reporter is None else self.reporter.changed
        self.health = HealthFanout(self.telemetry, changed)
        self._supervisor: Supervisor | None = None
        self._reloading = asyncio.Lock()
        self._together: Together | None = None

    def _holders(self, metrics: Metrics, socket: Path) -> DeviceHolders:
        """node_agent_device_allocated: asked of pod-resources at each scrape, and often."""
        from agents.holders import DeviceHolders, HoldersCollector
        from agents.kernel.kubelet_facts import PodResources

        asked = PodResources(socket, effect="no node_agent_device_allocated series")
        holders = DeviceHolders(asked, self.resources, self.timing.holders_poll_s, self.dra_names)
        metrics.add(HoldersCollector(holders), holders.refresh)
        return holders

    def _held(self) -> Holdings | None:
        """The other APIs' leftovers as one, if any."""
        if len(self.leftovers) <= 1:
            return next(iter(self.leftovers), None)
        if self._together is None:
            self._together = Together(self.leftovers)
        return self._together

    def family(self, of_type: type[F]) -> F | None:
        """The running family of this type, if any (for tests and the demo)."""
        return next((f for f in self.families.values() if isinstance(f, of_type)), None)

    def resources(self) -> list[FamilyResource]:
        return [r for f in self.families.values() for r in f.resources()]

    def dra_names(self) -> dict[tuple[str, str], tuple[str, str]]:
        """(DRA driver, device name) -> (resource, device ID) of every family's devices."""
        return {
            (facts.driver, d.name): (d.resource, d.device_id)
            for facts in (f.facts() for f in self.families.values())
            for d in facts.devices
        }

    def device_health(self) -> list[DeviceHealth]:
        """Every advertised device's health and its cause, over all families."""
        return [state for f in self.families.values() for state in f.device_health()]

    def labels(self) -> dict[str, str]:
        """Node labels of every family, and whether GPUs and NICs share a switch."""
        labels = {k: v for f in self.families.values() for k, v in f.labels().items()}
        if self.pairing is not None:
            located = {
                k.pairs_as: self.families[k.name].locations() for k in self.kinds if k.pairs_as
            }
            labels |= pairs_label(located.get(GPU, {}), located.get(NIC, {}))
        return labels

    def serving(self) -> bool:
        """Liveness: every resource's server is up."""
        return self.manager is not None and self.manager.serving()

    async def start(self) -> Runtime:
        """Discover and build every family. Raises ConfigError or BackendError."""
        if self.manager is not None:
            return self.manager
        fresh = await self._make(self.kinds, self.config, self.config_source)
        try:
            held = self._held()
            if held is not None:
                await held.load(fresh)
            host = Host(
                lambda: list(self.families.values()),
                lambda: self.config,
                self.telemetry,
                withheld=held,
            )
            manager = self.api.runtime(fresh, host)
            manager.check(fresh)
        except BaseException:
            await _close(fresh)
            raise
        for family in fresh:  # nothing below can fail: the families are the agent's now
            self._adopt(family, self.config)
        self._say_pairing()
        self.manager = manager
        if self.metrics is not None:
            self.metrics.watch_resources(self.resources)
        return manager

    async def _make(self, kinds: Sequence[AnyKind], config: Config, source: str) -> list[Family]:
        """Families of `config`, discovered off the loop and built on it; nothing of the
        agent is changed. Raises ConfigError or BackendError, holding nothing then."""
        made: list[Family] = []
        try:
            for kind in kinds:
                view = config_view(kind, config)
                if self.api.names_devices:
                    view = kind.named_devices(view)
                discover = functools.partial(kind.discover, view, self.backends, source)
                found = await off_loop(discover, f"{kind.name}-discovery")
                made.append(kind.build(found, view, self._context(kind, config)))
                if not any(r.inventory.devices for r in made[-1].resources()):
                    log.info("family_without_devices", family=kind.name, effect="no resources")
        except BaseException:
            await _close(made)
            raise
        return made

    def _context(self, kind: AnyKind, config: Config) -> Context:
        side = None
        if self.pairing is not None and kind.pairs_as is not None and config.pairing.enabled:
            side = self.pairing.side(kind.pairs_as)
        return Context(self.backends, self.health, side, self.timing)

    def _adopt(self, family: Family, config: Config) -> None:
        """Make `family` the agent's, and tell pairing where its devices are."""
        self.families[family.name] = family
        kind = next(k for k in self.kinds if k.name == family.name)
        if self.pairing is None or kind.pairs_as is None:
            return
        if config.pairing.enabled:
            located = family.located()
            self.pairing.located(kind.pairs_as, located.resource, located.devices)
        else:
            self.pairing.withdraw(kind.pairs_as)

    async def reload(self, config: Config, source: str | None = None) -> None:
        """Apply a new config (read from `source`, if another file than before): families
        whose sections changed are built anew, and only resources whose definition changed
        register again. Raises ConfigError or BackendError, and changes nothing, when the
        new config cannot be applied."""
        source = self.config_source if source is None else source
        async with self._reloading:
            manager = await self.start()
            if config == self.config:
                self.config_source = source
                log.info("config_unchanged", source=source)
                return
            changed = [
                k for k in self.kinds if config_view(k, self.config) != config_view(k, config)
            ]
            before = {r.name: _definition(r) for r in self.resources()}
            fresh = await self._make(changed, config, source)
            built = {f.name: f for f in fresh}
            families = [built.get(n, f) for n, f in self.families.items()]
            now = [r for f in families for r in f.resources()]
            try:
                manager.check(families)
            except BaseException:
                await _close(fresh)
                raise
            await self._swap(fresh, config)
            self.config_source = source
            unchanged = {r.name for r in now if before.get(r.name) == _definition(r)}
            await manager.replace(families, unchanged)
            if self._supervisor is not None:
                for family in fresh:
                    self._supervisor.start(_task(family), family.run)
                self._start_labels()
            log.info(
                "config_reloaded",
                source=self.config_source,
                families=[k.name for k in changed],
                changed=sorted(r.name for r in now if r.name not in unchanged),
                withdrawn=sorted(set(before) - {r.name for r in now}),
            )

    async def _swap(self, fresh: Sequence[Family], config: Config) -> None:
        """Replace the running families by `fresh` ones: the old ones end (and give back
        what they hold) first; then the new ones are adopted, with no await between."""
        for family in fresh:
            old = self.families[family.name]
            if self._supervisor is not None:
                await self._supervisor.end(_task(old))
            await old.close()
        for family in fresh:
            family.follow(self.families[family.name])
            self._adopt(family, config)
        self.config = config
        self._say_pairing()

    def _say_pairing(self) -> None:
        """Log what is paired and what is not (after a start or a reload)."""
        if self.pairing is not None:
            self.pairing.start({r.name: r.summary for r in self.resources()})

    def _start_labels(self) -> None:
        """(Re)start the node-label loops (feature file, Node patches) on the current families."""
        tasks, inventories = self._supervisor, [r.inventory for r in self.resources()]
        if tasks is None:
            return
        from agents.labels import keep_labels, prefixed

        if self.nfd_features_file is not None:
            path = self.nfd_features_file
            tasks.start("labels", lambda: keep_labels(path, self.labels, inventories))
        labeller = self.node_labeller
        if labeller is not None:

            def wanted() -> dict[str, str]:
                return prefixed(self.labels())

            tasks.start("node-labels", lambda: labeller.run(wanted, inventories))

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set; any task failing stops the rest and is raised."""
        await until(stop, self.serve)

    def _metrics_tasks(self) -> list[tuple[str, Job]]:
        """The metrics server and who holds which device, where metrics are on."""
        tasks: list[tuple[str, Job]] = []
        if self.metrics_server is not None:
            tasks.append(("metrics", self.metrics_server.serve))
        if self.holders is not None:
            tasks.append(("holders", self.holders.run))
        return tasks

    def _share_tasks(self, manager: Runtime) -> list[tuple[str, Job]]:
        """DRA: each pod's GPU memory beside its share, and its Event when over it."""
        if not self.api.names_devices:
            return []
        from agents.share_watch import share_watch

        period = self.timing.gpu_probe_s
        watch = share_watch(
            manager, self.api, self.backends, period, metrics=self.metrics, config=self.config
        )
        return [] if watch is None else [("gpu-shares", watch.run)]

    async def serve(self) -> None:
        """Start if not started, and serve until cancelled."""
        try:
            manager = await self.start()
            async with asyncio.TaskGroup() as group:
                tasks = self._supervisor = Supervisor(group)
                tasks.start("runtime", manager.run)
                if self.pairing is not None:
                    tasks.start("pairing", self.pairing.run)
                if self.backends.simulated is not None:
                    tasks.start("simulated-node", self.backends.simulated.run)
                held = self._held()
                if held is not None:
                    tasks.start("leftovers", held.run)
                for name, run in [*self._metrics_tasks(), *self._share_tasks(manager)]:
                    tasks.start(name, run)
                if self.reporter is not None:
                    reporter = self.reporter
                    tasks.start("cluster", lambda: reporter.run(self.device_health))
                for family in self.families.values():
                    tasks.start(_task(family), family.run)
                self._start_labels()
        except BaseExceptionGroup as group:
            raise cause(group) from None
        finally:
            self._supervisor = None
            for family in self.families.values():
                await family.close()
            self.backends.links.close()
            if self.backends.lldp is not None:
                self.backends.lldp.close()
            if self.node_labeller is not None:
                await self.node_labeller.aclose()
            if self.pairing is not None:
                await self.pairing.close()


async def _close(families: Sequence[Family]) -> None:
    """Give back what the discoveries of families that will never run took."""
    for family in families:
        await family.close()


def _task(family: Family) -> str:
    return f"family:{family.name}"


def _definition(resource: FamilyResource) -> Hashable:
    return type(resource).__name__, resource.definition()
