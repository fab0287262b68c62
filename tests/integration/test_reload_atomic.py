"""A reload is all or nothing: discovery runs off the event loop and returns values, and
live state (families, pairing, resources) changes only once nothing can fail any more.
A reload that fails at any step leaves everything as it was, and reloads under a steady
stream of GetPreferredAllocation and Allocate never cost a pair."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agents.backends import Backends, simulated_backends
from agents.config import Config, parse_config
from agents.core.topology import Topology
from agents.daemon import Agent
from agents.errors import BackendError, ConfigError
from agents.family import AnyKind, Context, Family
from agents.gpu.kind import GpuKind, discover_gpus
from agents.plugin.api import DevicePlugins
from agents.plugin.kubelet_pairing import Pairing
from agents.roce.family import discover_nics
from agents.roce.kind import RoceKind
from agents.sim.nvml import SimNvml
from agents.standin.kubelet import Container, Kubelet, Pod, PodAllocation
from tests.conditions import WAIT, async_wait_until
from tests.families import plugin_manager
from tests.integration.conftest import AgentProcess

GPU, NIC = "nvidia.com/gpu", "rdma/roce"
STARTUP = 20.0  # a new Python process and its imports
RELOADS = 50
# Each differs from the other and from the defaults in both families' sections, with the
# same devices and pairing on: every reload between them rebuilds both families.
CONFIGS = (
    "version: v1\nhealth: {disabledXids: [13]}\nroce: {selectors: {vendors: ['15b3', '8086']}}\n",
    "version: v1\nhealth: {disabledXids: [31]}\nroce: {selectors: {vendors: ['8086', '15b3']}}\n",
)


class Failing:
    """A family kind whose discovery fails once `failing` is set (sysfs gone)."""

    def __init__(self, kind: AnyKind) -> None:
        self._kind = kind
        self.name, self.sections, self.pairs_as = kind.name, kind.sections, kind.pairs_as
        self.failing = False

    def discover(self, config: Config, backends: Backends, source: str) -> Any:
        if self.failing:
            raise BackendError("sysfs: the NICs cannot be read")
        return self._kind.discover(config, backends, source)

    def build(self, found: Any, config: Config, context: Context) -> Family:
        return self._kind.build(found, config, context)

    def named_devices(self, config: Config) -> Config:
        return self._kind.named_devices(config)


@dataclass
class Running:
    agent: Agent
    kubelet: Kubelet
    backends: Backends
    partners: dict[str, set[str]]  # GPU -> the NICs on its switch

    async def admit_pair(self, name: str) -> PodAllocation:
        pod = await self.kubelet.admit(Pod(name, [Container("c", {GPU: 2, NIC: 2})]))
        await self.kubelet.release(name)
        return pod

    def paired(self, pod: PodAllocation) -> bool:
        return paired(self.partners, pod)

    def state(self) -> tuple[object, ...]:
        """Everything a reload may change, by identity where identity is the point."""
        agent = self.agent
        assert isinstance(agent.pairing, Pairing)
        servers = plugin_manager(agent).servers
        nvml = self.backends.nvml
        assert isinstance(nvml, SimNvml)
        return (
            agent.config,
            {name: id(f) for name, f in agent.families.items()},
            {name: id(s.resource) for name, s in servers.items()},
            agent.pairing.resources(),
            agent.pairing.active,
            len(self.kubelet.registrations),
            {name: id(self.kubelet.endpoint(name)) for name in (GPU, NIC)},
            nvml.inits,
        )


def paired(partners: dict[str, set[str]], pod: PodAllocation) -> bool:
    """Each GPU of the pod's container has a NIC of the container on its switch."""
    got = pod.containers["c"].devices
    return all(partners[g] & set(got[NIC]) for g in got[GPU])


def partners_of(backends: Backends) -> dict[str, set[str]]:
    config = Config.default()
    gpus = discover_gpus(backends.nvml, backends.sysfs, config, "<test>").gpus
    backends.nvml.shutdown()
    nics = discover_nics(backends.sysfs, config).nics
    topology = Topology(
        {g.uuid: g.location for g in gpus if g.location},
        {n.pci: n.location for n in nics if n.location},
    )
    return {gpu: set(near) for gpu, near in topology.pairs().items()}


@contextlib.asynccontextmanager
async def running(
    node_file: Path, kubelet: Kubelet, kinds: Sequence[AnyKind]
) -> AsyncIterator[Running]:
    async with simulated_backends(node_file) as backends:
        partners = partners_of(backends)
        agent = Agent(
            Config.default(), "<test>", DevicePlugins(kubelet.plugin_dir), backends, kinds
        )
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await kubelet.wait_until(lambda k: k.allocatable() == {GPU: 8, NIC: 8}, WAIT)
            yield Running(agent, kubelet, backends, partners)
        finally:
            stop.set()
            await asyncio.wait_for(task, WAIT)


async def test_a_reload_whose_second_family_fails_changes_nothing(
    node_file: Path, kubelet: Kubelet, edit_node: Callable[..., None]
) -> None:
    roce = Failing(RoceKind())
    async with running(node_file, kubelet, (GpuKind(), roce)) as run:
        assert run.paired(await run.admit_pair("before"))
        before = run.state()

        roce.failing = True
        with pytest.raises(BackendError, match="NICs cannot be read"):
            await run.agent.reload(parse_config(CONFIGS[0], "<test>"))

        assert run.state() == before  # the GPU family built for it gave NVML back too
        assert run.paired(await run.admit_pair("after"))
        # The families that kept running still keep health.
        edit_node(lambda d: d["gpus"][5]["xids"].append(79))
        await kubelet.wait_until(lambda k: k.allocatable()[GPU] == 7, WAIT)


async def test_a_reload_whose_families_clash_in_a_resource_name_changes_nothing(
    node_file: Path, kubelet: Kubelet
) -> None:
    async with running(node_file, kubelet, (GpuKind(), RoceKind())) as run:
        before = run.state()
        clash = "version: v1\nhealth: {disabledXids: [13]}\nroce: {resourceName: nvidia.com/gpu}\n"

        with pytest.raises(ConfigError, match=r"nvidia\.com/gpu"):
            await run.agent.reload(parse_config(clash, "<test>"))

        assert run.state() == before
        assert run.paired(await run.admit_pair("after"))


async def test_50_sighup_reloads_under_steady_rpcs_cost_no_pair_and_no_error(
    node_file: Path,
    plugin_dir: Path,
    tmp_path: Path,
    kubelet: Kubelet,
    start_agent: Callable[[Sequence[str]], AgentProcess],
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIGS[1])
    agent = start_agent(
        [
            *("run", "--simulate", str(node_file), "--device-plugin-dir", str(plugin_dir)),
            *("--config", str(config)),
        ]
    )
    await kubelet.wait_until(lambda k: k.allocatable() == {GPU: 8, NIC: 8}, STARTUP)
    async with simulated_backends(node_file) as backends:
        partners = partners_of(backends)
    pods: list[PodAllocation] = []
    reloading = True

    async def admit_without_pause() -> None:
        while reloading:
            name = f"pod-{len(pods)}"
            pods.append(await kubelet.admit(Pod(name, [Container("c", {GPU: 2, NIC: 2})])))
            await kubelet.release(name)

    def reloaded() -> int:
        return agent.stderr.count("config_reloaded")

    admitting = asyncio.create_task(admit_without_pause())
    try:
        for n in range(RELOADS):
            config.write_text(CONFIGS[n % 2])
            agent.process.send_signal(signal.SIGHUP)

            def done(n: int = n) -> bool:
                return reloaded() == n + 1

            await async_wait_until(done, WAIT, f"reload {n + 1}")
            assert not admitting.done()
    finally:
        reloading = False
        await asyncio.wait_for(admitting, WAIT)

    unpaired = [p.pod for p in pods if not paired(partners, p)]
    print(
        f"figure: {len(pods)} pods of 2 GPUs + 2 NICs over {RELOADS} reloads, "
        f"{len(pods) - len(unpaired)} paired"
    )
    assert len(pods) >= RELOADS
    assert unpaired == []
    assert "config_reload_refused" not in agent.stderr
    assert "request_failed" not in agent.stderr and "request_refused" not in agent.stderr
    assert agent.alive()
    assert agent.terminate() == 0


async def test_a_gpu_held_unhealthy_by_an_xid_stays_so_across_a_reload_without_a_flap(
    node_file: Path, node_doc: dict[str, Any], kubelet: Kubelet, edit_node: Callable[..., None]
) -> None:
    async with running(node_file, kubelet, (GpuKind(), RoceKind())) as run:
        edit_node(lambda d: d["gpus"][5]["xids"].append(79))
        await kubelet.wait_until(lambda k: k.allocatable()[GPU] == 7, WAIT)
        view = kubelet.resource(GPU)
        assert view is not None
        updates = view.updates

        await run.agent.reload(parse_config(CONFIGS[0], "<test>"))  # rebuilds both families
        # The rebuilt family sees the next fault: only that one reaches the kubelet.
        edit_node(lambda d: d["gpus"][2]["xids"].append(79))
        await kubelet.wait_until(lambda k: k.allocatable()[GPU] == 6, WAIT)

        assert view.updates == updates + 1
        uuids = [g["uuid"] for g in node_doc["gpus"]]
        assert {d for d, s in view.devices.items() if s.health == "Unhealthy"} == {
            uuids[2],
            uuids[5],
        }
