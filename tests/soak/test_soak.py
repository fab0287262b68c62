"""Soak: many kubelet restarts, an agent killed under load, and node-file churn.

SOAK_SCALE scales every count (default 0.1 for the ordinary run; hack/soak uses 1):
200 restarts, 1000 churn edits at full scale.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.backends import simulated_backends
from agents.config import Config
from agents.core.health import GpuLost
from agents.core.xid import HOLD_S
from agents.daemon import Agent
from agents.gpu.family import GpuFamily
from agents.plugin.api import DevicePlugins
from agents.sim.bundled import bundled_node
from agents.sim.node import parse_node
from agents.sim.specs import NodeSpec
from agents.standin.kubelet import AdmissionError, Container, Kubelet, Pod, PodAllocation
from hack.benchlib.agent import GPU, NIC, AgentProcess
from hack.benchlib.nodes import write_yaml
from tests.conditions import async_wait_until
from tests.soak.unstarved import UnstarvedClock

SCALE = float(os.environ.get("SOAK_SCALE", "0.1"))
# Against hangs only, every wait has its own limit: a test starts agents one after
# another, and each start took up to 12 s on a loaded 2-core machine (the suite's 60 s
# is too short there). At full scale the same as hack/soak gives.
TIMEOUT_S = round(180 * max(SCALE / 0.1, 1))

pytestmark = [pytest.mark.soak, pytest.mark.timeout(TIMEOUT_S)]
NODE = "h100-8gpu-8nic"
RESOURCES = (GPU, NIC)
WAIT = 10.0
# Waits on an agent process count only time that neither it nor this process spent
# waiting for a CPU (a fresh agent on a loaded 2-core machine took 7 s of wall time
# for well under 2 s of its own); the wall-clock limit only ends a wait that a starved
# machine would otherwise stretch past the test's own timeout.
WALL_LIMIT = 45.0


def scaled(full: int) -> int:
    return max(2, round(full * SCALE))


@pytest.fixture
def work() -> Iterator[Path]:
    # Short: unix socket paths must fit in 108 bytes.
    path = Path(tempfile.mkdtemp(prefix="soak-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def running(work: Path) -> AsyncIterator[tuple[Kubelet, AgentProcess]]:
    node = work / "node.yaml"
    shutil.copy(bundled_node(NODE), node)
    agent = AgentProcess(work, node)
    kubelet = Kubelet(agent.plugin_dir, seed=5)
    await kubelet.start()
    agent.start()
    try:
        await agent_settles(kubelet, agent, lambda k: registered_since(k, 0))
        yield kubelet, agent
    finally:
        agent.stop(signal.SIGKILL)
        await kubelet.stop()


async def agent_settles(
    kubelet: Kubelet, agent: AgentProcess, predicate: Callable[[Kubelet], bool]
) -> None:
    """Until predicate(kubelet) holds, re-checked on every change; fail if the agent exits,
    or after WAIT seconds of time that the agent and the stand-in had a CPU for."""
    clock = UnstarvedClock((os.getpid(), agent.pid))
    what = getattr(predicate, "__qualname__", repr(predicate))
    while not predicate(kubelet):
        assert agent.proc is not None
        if agent.proc.poll() is not None:
            tail = (agent.work / "agent.log").read_text()[-2000:]
            raise AssertionError(f"agent exited with {agent.proc.returncode}:\n{tail}")
        if clock.elapsed() > WAIT or clock.wall() > WALL_LIMIT:
            raise TimeoutError(
                f"{what} still false after {clock.wall():.1f}s, {clock.elapsed():.1f}s of "
                f"them not waiting for a CPU; {kubelet.summary()}"
            )
        with contextlib.suppress(TimeoutError):  # a slice: then look at the clock again
            await kubelet.wait_until(predicate, 0.25)


def registered_since(kubelet: Kubelet, mark: int) -> bool:
    fresh = {r.resource_name for r in kubelet.registrations[mark:] if r.error is None}
    views = [kubelet.resource(r) for r in RESOURCES]
    # Connected, and the first device list of the new stream is in.
    return set(RESOURCES) <= fresh and all(
        v is not None and v.connected and v.healthy() for v in views
    )


def free(kubelet: Kubelet, resource: str) -> set[str]:
    view = kubelet.resource(resource)
    healthy = view.healthy() if view is not None else set()
    return healthy - kubelet.allocated().get(resource, set())


async def admit_some(
    kubelet: Kubelet, rng: random.Random, name: str, live: list[str]
) -> PodAllocation:
    """Admit a pod of GPUs and NICs, deleting earlier ones first while it would not fit
    (the scheduler would not send it); any admission error is the agent's and fails."""
    limits = {GPU: rng.randint(1, 2), NIC: rng.randint(0, 1)}
    limits = {r: n for r, n in limits.items() if n}
    while live and any(len(free(kubelet, r)) < n for r, n in limits.items()):
        await kubelet.release(live.pop(0))
    allocation = await kubelet.admit(Pod(name, [Container("c", limits)]))
    live.append(name)
    got = allocation.containers["c"]
    # The agent's Allocate answer names exactly the devices it was given.
    visible = got.responses[GPU].envs["NVIDIA_VISIBLE_DEVICES"].split(",")
    assert sorted(visible) == sorted(got.devices[GPU])
    return allocation


def advertised(kubelet: Kubelet) -> dict[str, dict[str, str]]:
    """Every device the agent lists to the kubelet, with its health."""
    views = {r: kubelet.resource(r) for r in RESOURCES}
    return {r: {i: d.health for i, d in v.devices.items()} for r, v in views.items() if v}


def sockets(plugin_dir: Path) -> set[str]:
    return {p.name for p in plugin_dir.iterdir() if p.is_socket()}


async def test_kubelet_restarts_reregister_every_time_without_leaks(
    running: tuple[Kubelet, AgentProcess],
) -> None:
    kubelet, agent = running
    rng = random.Random(1)
    expected_sockets = sockets(agent.plugin_dir)
    fds, threads = [agent.fd_count()], [agent.thread_count()]
    live: list[str] = []
    for n in range(scaled(200)):
        await kubelet.stop()
        mark = len(kubelet.registrations)
        await kubelet.start()
        await agent_settles(kubelet, agent, partial(registered_since, mark=mark))
        await admit_some(kubelet, rng, f"restart-{n}", live)
        assert sockets(agent.plugin_dir) == expected_sockets
        fds.append(agent.fd_count())
        threads.append(agent.thread_count())
    # A few descriptors come and go with in-flight connections; growth per restart would show.
    assert max(fds[len(fds) // 2 :]) <= fds[0] + 4, fds
    assert max(threads) <= threads[0] + 2, threads


async def test_agent_killed_under_load_comes_back_and_allocations_stay(
    running: tuple[Kubelet, AgentProcess],
) -> None:
    kubelet, agent = running
    rng = random.Random(2)
    live: list[str] = []
    before = advertised(kubelet)
    assert all(h == "Healthy" for devices in before.values() for h in devices.values())
    for round_ in range(scaled(20)):
        load = asyncio.ensure_future(_admit_forever(kubelet, rng, f"r{round_}", live))
        try:
            await asyncio.sleep(0)  # the admissions are in flight as the agent dies
            agent.stop(signal.SIGKILL)
        finally:
            load.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await load
        stale = sockets(agent.plugin_dir)
        assert {p for p in stale if p.startswith("node-agent-")}, "SIGKILL leaves stale sockets"
        mark = len(kubelet.registrations)
        agent.start()
        await agent_settles(kubelet, agent, partial(registered_since, mark=mark))
        # The agent comes back with every device, healthy, under the same IDs ...
        await agent_settles(kubelet, agent, lambda k: advertised(k) == before)
        # ... and serves the next pod beside those admitted before it died.
        held = kubelet.allocated()
        got = (await admit_some(kubelet, rng, f"after-{round_}", live)).containers["c"]
        for resource, ids in got.devices.items():
            assert not set(ids) & held.get(resource, set()), (resource, ids, held)


async def _admit_forever(
    kubelet: Kubelet, rng: random.Random, prefix: str, live: list[str]
) -> None:
    n = 0
    while True:
        # The agent is killed while these are in flight: a failed admission is expected.
        with contextlib.suppress(AdmissionError):
            await admit_some(kubelet, rng, f"{prefix}-{n}", live)
        n += 1
        await asyncio.sleep(0)


def expected_health(doc: dict[str, Any]) -> tuple[dict[str, str], dict[str, str]]:
    """After every GPU was seen lost: the GPUs that answer again were reset (their XIDs
    cleared), the others are still lost."""

    def word(ok: bool) -> str:
        return "Healthy" if ok else "Unhealthy"

    gpus = {g["uuid"]: word(not g["lost"]) for g in doc["gpus"]}
    nics = {n["pci"]: word(n["link"] == "up") for n in doc["nics"]}
    return gpus, nics


def churn(doc: dict[str, Any], rng: random.Random) -> None:
    """One random fault on or off."""
    if rng.random() < 0.6:
        gpu = rng.choice(doc["gpus"])
        what = rng.random()
        if what < 0.4:
            gpu["xids"] = sorted({*gpu["xids"], rng.choice([13, 31, 43, 48, 63, 74, 79, 94])})
        elif what < 0.7:
            gpu["xids"] = []
        else:
            gpu["lost"] = not gpu["lost"]
    else:
        nic = rng.choice(doc["nics"])
        nic["link"] = "down" if nic["link"] == "up" else "up"


async def test_node_file_churn_ends_with_health_exactly_as_the_health_model_says(
    work: Path,
) -> None:
    node = work / "node.yaml"
    shutil.copy(bundled_node(NODE), node)
    doc: dict[str, Any] = yaml.safe_load(node.read_text())
    kubelet = Kubelet(work / "device-plugins", seed=3)
    await kubelet.start()
    stop = asyncio.Event()
    rng = random.Random(4)
    async with simulated_backends(node) as backends:
        agent = Agent(Config.default(), "<soak>", DevicePlugins(kubelet.plugin_dir), backends)
        await agent.start()
        task = asyncio.ensure_future(agent.run(stop))
        try:
            await kubelet.wait_until(lambda k: registered_since(k, 0), WAIT)
            sim = backends.simulated
            assert sim is not None
            await asyncio.wait_for(sim.watching.wait(), WAIT)
            for n in range(scaled(1000)):
                churn(doc, rng)
                write_yaml(node, doc)
                if n % 10 == 0:  # now and then let an edit land before the next one
                    spec = parse_node(node.read_text(), str(node))

                    def applied(spec: NodeSpec = spec) -> bool:
                        return sim.spec == spec

                    await async_wait_until(applied, WAIT, "edit applied")
            # After the churn a GPU's health depends on which XIDs and resets the agent
            # saw; settle it: every GPU falls off the bus, then some come back (a reset).
            gpu = agent.family(GpuFamily)
            assert gpu is not None
            for g in doc["gpus"]:
                g["lost"] = True
            write_yaml(node, doc)
            await async_wait_until(
                lambda: all(gpu.unhealthy_cause(g["uuid"]) == GpuLost() for g in doc["gpus"]),
                WAIT,
                "every GPU seen lost",
            )
            for g in doc["gpus"]:
                g["lost"] = rng.random() < 0.3
            write_yaml(node, doc)
            gpus, nics = expected_health(doc)

            def matches(k: Kubelet) -> bool:
                return _health(k, GPU) == gpus and _health(k, NIC) == nics

            # NIC flaps are held back for a while by design, a reset GPU for the hold
            # time; the last state must land.
            await kubelet.wait_until(matches, WAIT + HOLD_S)
        finally:
            stop.set()
            await task
    await kubelet.stop()


def _health(kubelet: Kubelet, resource: str) -> dict[str, str]:
    view = kubelet.resource(resource)
    return {} if view is None else {i: s.health for i, s in view.devices.items()}
