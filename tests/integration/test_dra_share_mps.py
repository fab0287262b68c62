"""DRA shares' one MPS control daemon, the GPU family and the DRA driver together in this
process, on a simulated node with `mps: {available: true}` whose NVML, tree and daemon
outlive the agent as a real node's do: the daemon started before the first share, a GPU
EXCLUSIVE_PROCESS while it holds shares and DEFAULT after its last, a whole GPU left
alone, a mode that cannot be set failing its claim, the daemon watched, started again and
adopted by a restarted agent. tests/integration/test_dra_share_mps_agent.py runs the agent
as a process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from structlog.testing import capture_logs

from agents.backends import Backends
from agents.config import parse_config
from agents.core.health import DeviceHealth
from agents.dra.claim_checkpoint import CHECKPOINT, ClaimCheckpoint
from agents.dra.claims import AllocationResult, Claim, ClaimError
from agents.dra.driver import ClaimRef, ClaimStore, Driver
from agents.errors import BackendError
from agents.family import Context, config_view
from agents.gpu.family import GpuFamily
from agents.gpu.kind import GpuKind
from agents.gpu.mps import MpsDaemonDown
from agents.sim.bundled import bundled_node
from agents.sim.mps_control import LOG_FILE, PID_FILE
from agents.sim.nvml import SimNvml
from agents.sim.simnode import SimulatedNode
from agents.timing import Timing
from tests.conditions import WAIT, async_wait_until

SHARED = "version: v1\nsharing:\n  shares: {}\n"
DRIVER = "gpu.nvidia.com"
POOL = "node"
PIPES = "run/nvidia/mps/gpu.nvidia.com"
QUARTER = {"memory": "20Gi", "compute": "25"}
EXCLUSIVE, DEFAULT = "EXCLUSIVE_PROCESS", "DEFAULT"
FAST = Timing(gpu_probe_s=0.1, mps_restart_s=3600.0)  # a dead daemon stays dead


class Sink:
    """Every health evaluation the family hands on."""

    def __init__(self) -> None:
        self.seen: list[list[DeviceHealth]] = []

    def publish(self, states: Iterable[DeviceHealth]) -> None:
        self.seen.append(list(states))

    def readings(self, resource: str, device: str, values: Mapping[str, float | None]) -> None:
        pass

    def xid(self, resource: str, device: str, xid: int) -> None:
        pass


@dataclass
class Node:
    """The simulated node's hardware and files: what an agent's restart leaves."""

    sim: SimulatedNode
    root: Path
    nvml: SimNvml
    claims: dict[str, Claim] = field(default_factory=dict)

    @property
    def pipe(self) -> Path:
        return self.sim.dev_root / PIPES / "pipe"

    def told(self) -> list[str]:
        """What the daemon was told, in order."""
        path = self.sim.dev_root / PIPES / "log" / LOG_FILE
        return path.read_text().splitlines() if path.exists() else []

    def pid(self) -> int | None:
        path = self.pipe / PID_FILE
        return int(path.read_text()) if path.exists() else None

    def mode(self, uuid: str) -> str:
        return self.nvml.compute_mode(uuid)

    def share(self, uid: str, *devices: str, whole: bool = False) -> ClaimRef:
        results = tuple(
            AllocationResult("gpu", DRIVER, POOL, d)
            if whole
            else AllocationResult("gpu", DRIVER, POOL, d, share_id=f"{uid}-share", consumed=QUARTER)
            for d in devices
        )
        self.claims[uid] = Claim("ns", f"c-{uid}", uid, results, ())
        return ClaimRef("ns", uid, f"c-{uid}")


@dataclass
class Agent:
    family: GpuFamily
    driver: Driver
    sink: Sink

    def uuid(self, device: str) -> str:
        found = self.driver.device(device)
        assert found is not None
        return found.device_id

    async def prepare(self, ref: ClaimRef) -> str:
        """ "" when prepared, else the claim's error."""
        answer = (await self.driver.prepare([ref]))[ref.uid]
        return str(answer) if isinstance(answer, ClaimError) else ""

    def causes(self) -> dict[str, object]:
        return {h.device_id: h.cause for h in self.family.device_health()}


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    yield from simulated(tmp_path)


def simulated(tmp_path: Path, capabilities: Mapping[int, str] | None = None) -> Iterator[Node]:
    """The h100 node with MPS; `capabilities` the compute capability of GPUs by index."""
    doc = yaml.safe_load(bundled_node("h100-8gpu-8nic").read_text())
    doc["mps"] = {"available": True}
    for index, capability in (capabilities or {}).items():
        doc["gpus"][index]["computeCapability"] = capability
    (tmp_path / "node.yaml").write_text(yaml.safe_dump(doc))
    sim = SimulatedNode(tmp_path / "node.yaml", tmp_path / "root")
    sim.load()
    found = Node(sim, tmp_path, sim.nvml)
    try:
        yield found
    finally:  # the test's doing: an agent never stops the daemon
        assert sim.mps is not None
        with contextlib.suppress(BackendError):
            sim.mps.send(str(found.pipe), str(found.pipe.parent / "log"), "quit")


async def start(node: Node, timing: Timing = FAST, nvml: SimNvml | None = None) -> Agent:
    """An agent's start as DraRuntime.start makes it: discovery, the driver's checkpoint
    restored, its devices published, the family told of the shares restored."""
    kind = GpuKind()
    config = kind.named_devices(config_view(kind, parse_config(SHARED, "c.yaml")))
    sim = node.sim
    backends = Backends(nvml or node.nvml, sim.sysfs, sim.links, sim.dev_root, sim, mps=sim.mps)
    found = await asyncio.to_thread(kind.discover, config, backends, "c.yaml")
    sink = Sink()
    family = kind.build(found, config, Context(backends, sink, None, timing))

    async def read(ref: ClaimRef) -> Claim:
        return node.claims[ref.uid]

    store = ClaimStore(DRIVER, node.root / "plugins", node.root / "cdi")
    driver = Driver(DRIVER, POOL, store, read)
    await driver.restore()
    facts = family.facts()
    driver.publish(facts, {r.name: r for r in family.resources()}, family.edits)
    await driver.settle_shares()
    return Agent(family, driver, sink)


@contextlib.asynccontextmanager
async def running(agent: Agent) -> AsyncIterator[Agent]:
    """The family's loops (probes, the daemon's watch) until the block ends."""
    task = asyncio.ensure_future(agent.family.run())
    try:
        yield agent
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_the_daemon_runs_before_the_first_share_with_no_default_limits(
    node: Node,
) -> None:
    agent = await start(node)
    assert node.pid() is not None
    told = node.told()
    assert told and not [c for c in told if c.startswith("set_")]  # no limits of its own
    assert all(node.mode(g.uuid) == DEFAULT for g in agent.family.gpus)
    await agent.family.close()


async def test_a_gpu_is_exclusive_while_it_holds_shares_and_default_after_its_last(
    node: Node,
) -> None:
    agent = await start(node)
    gpu0, gpu1 = agent.uuid("gpu-0"), agent.uuid("gpu-1")
    with capture_logs() as logs:
        assert await agent.prepare(node.share("a", "gpu-0")) == ""
        assert node.mode(gpu0) == EXCLUSIVE
        assert await agent.prepare(node.share("b", "gpu-0")) == ""
        assert await agent.prepare(node.share("whole", "gpu-1", whole=True)) == ""
        assert node.mode(gpu1) == DEFAULT  # a whole GPU's mode is its user's
        await agent.driver.unprepare([ClaimRef("ns", "a", "c-a")])
        assert node.mode(gpu0) == EXCLUSIVE  # b's share still there
        await agent.driver.unprepare([ClaimRef("ns", "b", "c-b")])
        assert node.mode(gpu0) == DEFAULT
    changes = [(e["gpu"], e["mode"]) for e in logs if e["event"] == "gpu_compute_mode_set"]
    assert changes == [(gpu0, EXCLUSIVE), (gpu0, DEFAULT)]
    assert "quit" not in node.told()
    await agent.family.close()


async def test_a_share_whose_gpu_mode_cannot_be_set_fails_its_claim_changing_nothing(
    node: Node,
) -> None:
    agent = await start(node, nvml=SimNvml(node.sim.spec, privileged=False))
    error = await agent.prepare(node.share("a", "gpu-0"))
    assert f"GPU {agent.uuid('gpu-0')}: compute mode {EXCLUSIVE} not set" in error
    assert "Insufficient Permissions" in error
    assert agent.driver.prepared == {}
    assert ClaimCheckpoint(node.root / "plugins" / DRIVER / CHECKPOINT).load() == {}
    assert list((node.root / "cdi").glob("*")) == []
    assert await agent.prepare(node.share("whole", "gpu-1", whole=True)) == ""  # unaffected
    await agent.family.close()


async def test_a_restarted_agent_adopts_the_daemon_and_keeps_the_modes(node: Node) -> None:
    first = await start(node)
    gpu0 = first.uuid("gpu-0")
    assert await first.prepare(node.share("a", "gpu-0")) == ""
    pid = node.pid()
    await first.family.close()  # the agent stops: its daemon and the GPU's mode stay
    with capture_logs() as logs:
        again = await start(node)
    assert node.pid() == pid
    assert not [e for e in logs if e["event"] in ("gpu_compute_mode_set", "mps_daemon_started")]
    assert node.mode(gpu0) == EXCLUSIVE
    assert list(again.driver.prepared) == ["a"]
    await again.driver.unprepare([ClaimRef("ns", "a", "c-a")])  # known as held after restart
    assert node.mode(gpu0) == DEFAULT
    assert "quit" not in node.told()
    await again.family.close()


async def test_a_dead_daemon_makes_the_gpus_holding_shares_unhealthy_until_restarted(
    node: Node,
) -> None:
    timing = Timing(gpu_probe_s=0.1, mps_restart_s=0.5)
    async with running(await start(node, timing)) as agent:
        gpu0 = agent.uuid("gpu-0")
        assert await agent.prepare(node.share("a", "gpu-0")) == ""
        pid = node.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

        def down() -> bool:
            return isinstance(agent.causes()[gpu0], MpsDaemonDown)

        await async_wait_until(down, WAIT)
        causes = agent.causes()
        assert str(causes[gpu0].text()).startswith("MPS control daemon")  # type: ignore[attr-defined]
        assert [u for u, c in causes.items() if c is not None] == [gpu0]  # only the shared
        await async_wait_until(lambda: agent.causes()[gpu0] is None, WAIT)  # started again
        assert node.pid() not in (None, pid)
        assert list(agent.driver.prepared) == ["a"]  # the claim kept throughout
        assert node.mode(gpu0) == EXCLUSIVE
    await agent.family.close()


async def test_a_share_prepared_while_the_daemon_is_down_starts_it(node: Node) -> None:
    async with running(await start(node)) as agent:
        assert await agent.prepare(node.share("a", "gpu-0")) == ""
        pid = node.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        gpu0 = agent.uuid("gpu-0")
        await async_wait_until(lambda: agent.causes()[gpu0] is not None, WAIT)
        assert await agent.prepare(node.share("b", "gpu-1")) == ""  # the daemon started
        assert node.pid() not in (None, pid)
        await async_wait_until(lambda: agent.causes()[gpu0] is None, WAIT)
    await agent.family.close()


async def test_a_share_of_a_gpu_older_than_volta_is_told_no_mps_limit(tmp_path: Path) -> None:
    nodes = simulated(tmp_path, {0: "6.1"})
    node = next(nodes)
    with capture_logs() as logs:
        agent = await start(node)
    [said] = [e for e in logs if e["event"] == "gpu_shares_unenforced"]
    assert said["gpus"] == [0] and "older than Volta" in said["reason"]
    assert await agent.prepare(node.share("old", "gpu-0")) == ""
    assert await agent.prepare(node.share("new", "gpu-1")) == ""
    old, new = agent.driver.prepared["old"].env, agent.driver.prepared["new"].env
    assert not [k for k in old if k.startswith("CUDA_MPS_")]
    assert old["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert new["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    await agent.family.close()
    next(nodes, None)  # the fixture's end: the daemon told to quit


async def test_no_daemon_is_started_where_every_gpu_is_older_than_volta(tmp_path: Path) -> None:
    nodes = simulated(tmp_path, dict.fromkeys(range(8), "6.0"))
    node = next(nodes)
    with capture_logs() as logs:
        agent = await start(node)
    assert node.pid() is None
    reasons = [e["reason"] for e in logs if e["event"] == "gpu_shares_unenforced"]
    assert "every GPU is older than Volta (compute capability below 7.0)" in reasons
    assert await agent.prepare(node.share("old", "gpu-0")) == ""
    assert not [k for k in agent.driver.prepared["old"].env if k.startswith("CUDA_MPS_")]
    assert node.mode(agent.uuid("gpu-0")) == DEFAULT
    await agent.family.close()
    next(nodes, None)
