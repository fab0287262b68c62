"""Acceptance: the agent's life beside a kubelet that starts late, restarts, drops streams,
and sees faults, through the kubelet stand-in with the agent in-process on a simulated node."""

from __future__ import annotations

import asyncio
import contextlib
import stat
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest

from agents.api import api_pb2 as pb
from agents.api import api_pb2_grpc as pb_grpc
from agents.backends import simulated_backends
from agents.config import Config, parse_config
from agents.core.health import GpuLost
from agents.daemon import Agent
from agents.gpu.family import GpuFamily
from agents.plugin.api import DevicePlugins
from agents.standin.kubelet import Container, Kubelet, Pod
from agents.timing import Timing
from tests.conditions import WAIT, async_wait_until
from tests.families import plugin_manager, running_family
from tests.timing import SHORT

GPU = "nvidia.com/gpu"
NIC = "rdma/roce"
FAULT_SEEN_WITHIN = 1.0  # a node-file edit takes effect within one second

EditNode = Callable[..., None]


class RunningAgent:
    """An Agent on simulated backends, run as a task until `stop()`."""

    def __init__(self, agent: Agent, task: asyncio.Task[None], stop_event: asyncio.Event) -> None:
        self.agent = agent
        self.task = task
        self._stop = stop_event

    @property
    def sockets(self) -> list[Path]:
        return [s.socket_path for s in plugin_manager(self.agent).servers.values()]

    def serving(self) -> bool:
        return self.agent.serving() and all(p.exists() for p in self.sockets)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.wait_for(asyncio.shield(self.task), WAIT)


@contextlib.asynccontextmanager
async def running(
    node_file: Path, plugin_dir: Path, config: Config | None = None, timing: Timing = SHORT
) -> AsyncIterator[RunningAgent]:
    async with simulated_backends(node_file) as backends:
        agent = Agent(
            config or Config.default(), "<test>", DevicePlugins(plugin_dir), backends, timing=timing
        )
        await agent.start()
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        handle = RunningAgent(agent, task, stop)
        try:
            assert backends.simulated is not None
            await asyncio.wait_for(backends.simulated.watching.wait(), WAIT)
            yield handle
        finally:
            await handle.stop()


@pytest.fixture
async def agent(node_file: Path, plugin_dir: Path) -> AsyncIterator[RunningAgent]:
    async with running(node_file, plugin_dir) as handle:
        yield handle


def listed(resource: str, count: int, healthy: int | None = None) -> Callable[[Kubelet], bool]:
    """The kubelet has the resource connected with `count` devices, `healthy` of them Healthy."""

    def check(k: Kubelet) -> bool:
        view = k.resource(resource)
        return (
            view is not None
            and view.connected
            and len(view.devices) == count
            and len(view.healthy()) == (count if healthy is None else healthy)
        )

    check.__qualname__ = f"listed({resource}, {count}, healthy={healthy})"
    return check


def everything_listed(k: Kubelet) -> bool:
    return listed(GPU, 8)(k) and listed(NIC, 8)(k)


def health(k: Kubelet, resource: str, device: str) -> str | None:
    view = k.resource(resource)
    state = view.devices.get(device) if view is not None and view.connected else None
    return state.health if state is not None else None


async def timed_wait(
    kubelet: Kubelet, predicate: Callable[[Kubelet], bool], within: float
) -> float:
    started = time.monotonic()
    await kubelet.wait_until(predicate, within)
    return time.monotonic() - started


# Registration and the kubelet's life


async def test_agent_started_before_the_kubelet_registers_when_it_appears(
    node_file: Path, plugin_dir: Path
) -> None:
    async with running(node_file, plugin_dir) as handle:
        await async_wait_until(handle.serving, WAIT, "agent serving")
        assert not (plugin_dir / "kubelet.sock").exists()
        kubelet = Kubelet(plugin_dir, seed=7)
        await kubelet.start()  # deletes the agent's sockets first, as the kubelet does
        try:
            await kubelet.wait_until(everything_listed, WAIT)
        finally:
            await kubelet.stop()


async def test_kubelet_gone_for_a_while_and_back_gets_registration_and_devices_again(
    agent: RunningAgent, kubelet: Kubelet
) -> None:
    await kubelet.wait_until(everything_listed, WAIT)
    await kubelet.stop()
    await kubelet.wait_until(lambda k: k.allocatable() == {GPU: 0, NIC: 0}, WAIT)
    await async_wait_until(agent.serving, WAIT, "agent still serving without a kubelet")
    before = len(kubelet.registrations)

    await kubelet.start()
    took = await timed_wait(kubelet, everything_listed, WAIT)

    print(f"registered again and listed {took * 1000:.0f} ms after kubelet start")
    assert {r.resource_name for r in kubelet.registrations[before:]} == {GPU, NIC}


async def test_stream_cancelled_by_the_kubelet_leads_to_a_new_registration(
    agent: RunningAgent, kubelet: Kubelet
) -> None:
    await kubelet.wait_until(everything_listed, WAIT)
    before = len(kubelet.registrations)
    endpoint = kubelet.endpoint(GPU)
    assert endpoint is not None

    await endpoint.close()  # the kubelet's end of the stream goes away

    await kubelet.wait_until(lambda k: k.endpoint(GPU) is not endpoint and listed(GPU, 8)(k), WAIT)
    assert [r.resource_name for r in kubelet.registrations[before:]] == [GPU]
    assert listed(NIC, 8)(kubelet)


@contextlib.asynccontextmanager
async def other_client_stream(socket: Path) -> AsyncIterator[Any]:
    """A ListAndWatch stream of another client (a probe, grpcurl), open until the block ends."""
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        call = pb_grpc.DevicePluginStub(channel).ListAndWatch(pb.Empty())
        assert len((await asyncio.wait_for(call.read(), WAIT)).devices) > 0
        try:
            yield call
        finally:
            call.cancel()


async def test_other_clients_open_and_close_streams_without_a_new_registration(
    agent: RunningAgent,
    kubelet: Kubelet,
    plugin_dir: Path,
    node_doc: dict[str, Any],
    edit_node: EditNode,
) -> None:
    await kubelet.wait_until(everything_listed, WAIT)
    before = len(kubelet.registrations)
    endpoint = kubelet.endpoint(NIC)
    assert endpoint is not None
    manager = plugin_manager(agent.agent)
    server = manager.servers[NIC]
    assert server.open_streams == 1

    for _ in range(3):
        async with other_client_stream(plugin_dir / endpoint.socket.name):
            assert server.open_streams == 2
        await async_wait_until(lambda: server.open_streams == 1, WAIT, "other stream ended")
        assert NIC not in manager.pending

    # The kubelet's own stream is the one still open: it carries the next change.
    victim = node_doc["nics"][0]["pci"]
    edit_node(lambda d: d["nics"][0].__setitem__("link", "down"))
    await kubelet.wait_until(lambda k: health(k, NIC, victim) == "Unhealthy", WAIT)
    assert kubelet.endpoint(NIC) is endpoint
    assert len(kubelet.registrations) == before
    assert listed(NIC, 8, healthy=7)(kubelet)


async def test_kubelet_stream_lost_while_another_client_streams_registers_once_and_connects(
    agent: RunningAgent, plugin_dir: Path
) -> None:
    kubelet = Kubelet(plugin_dir, seed=7, stale_stream_bug=True)
    await kubelet.start()
    try:
        await kubelet.wait_until(everything_listed, WAIT)
        before = len(kubelet.registrations)
        endpoint = kubelet.endpoint(GPU)
        assert endpoint is not None
        async with other_client_stream(plugin_dir / endpoint.socket.name):
            await endpoint.close()  # the kubelet's stream ends; the other one stays

            await kubelet.wait_until(
                lambda k: k.endpoint(GPU) is not endpoint and listed(GPU, 8)(k), WAIT
            )
        # Every stream of the old server was closed before the new Register, so no old
        # stream ending later can cut the new endpoint off (kubelet's stale-stream bug).
        await async_wait_until(
            lambda: all(s.open_streams <= 1 for s in servers(agent)), WAIT, "old streams closed"
        )
        await kubelet.wait_until(everything_listed, WAIT)
        assert [r.resource_name for r in kubelet.registrations[before:]] == [GPU]
        assert all(r.error is None for r in kubelet.registrations)
    finally:
        await kubelet.stop()


async def test_reregistration_keeps_the_resource_connected_despite_the_stale_stream_bug(
    agent: RunningAgent, plugin_dir: Path
) -> None:
    kubelet = Kubelet(plugin_dir, seed=7, stale_stream_bug=True)
    await kubelet.start()
    try:
        await kubelet.wait_until(everything_listed, WAIT)
        before = len(kubelet.registrations)
        view = kubelet.resource(GPU)
        assert view is not None

        # Our socket vanishes under a running server: the agent serves afresh and
        # registers again while the kubelet still holds the old stream.
        (plugin_dir / view.endpoint).unlink()

        await kubelet.wait_until(lambda k: len(k.registrations) > before, WAIT)
        await kubelet.wait_until(everything_listed, WAIT)
        # Still connected once every old stream has had time to end: check again after
        # the agent's server has certainly closed all of them.
        await async_wait_until(
            lambda: all(s.open_streams <= 1 for s in servers(agent)), WAIT, "old streams closed"
        )
        await kubelet.wait_until(everything_listed, WAIT)
        assert all(r.error is None for r in kubelet.registrations)
    finally:
        await kubelet.stop()


def plugin_sockets(directory: Path) -> list[Path]:
    return sorted(directory.glob("node-agent-*.sock"))


def servers(agent: RunningAgent) -> list[Any]:
    return list(plugin_manager(agent.agent).servers.values())


# Health


@pytest.mark.parametrize("atomic", [True, False], ids=["atomic-rename", "in-place"])
async def test_xid_turns_the_gpu_unhealthy_within_a_second_and_only_a_reset_heals_it(
    agent: RunningAgent,
    kubelet: Kubelet,
    node_doc: dict[str, Any],
    edit_node: EditNode,
    atomic: bool,
) -> None:
    await kubelet.wait_until(everything_listed, WAIT)
    victim = node_doc["gpus"][3]["uuid"]

    edit_node(lambda d: d["gpus"][3]["xids"].append(79), atomic=atomic)
    took = await timed_wait(kubelet, lambda k: health(k, GPU, victim) == "Unhealthy", WAIT)

    print(f"XID 79 -> Unhealthy seen by the kubelet after {took * 1000:.0f} ms")
    assert took < FAULT_SEEN_WITHIN
    assert listed(GPU, 8, healthy=7)(kubelet)

    # Taking the XID out of the file is nothing NVML could report: no recovery. The XID
    # on another GPU in the same edit shows when the agent has taken that edit.
    other = node_doc["gpus"][4]["uuid"]

    def clear_and_mark(d: dict[str, Any]) -> None:
        d["gpus"][3]["xids"] = []
        d["gpus"][4]["xids"].append(48)

    edit_node(clear_and_mark, atomic=atomic)
    await timed_wait(kubelet, lambda k: health(k, GPU, other) == "Unhealthy", WAIT)
    assert health(kubelet, GPU, victim) == "Unhealthy"

    # A reset: the GPU falls off the bus and answers again; Healthy after the hold time.
    edit_node(lambda d: d["gpus"][3].__setitem__("lost", True), atomic=atomic)
    gpu = running_family(agent.agent, GpuFamily)
    await async_wait_until(lambda: gpu.unhealthy_cause(victim) == GpuLost(), WAIT, "lost seen")
    edit_node(lambda d: d["gpus"][3].__setitem__("lost", False), atomic=atomic)
    took = await timed_wait(kubelet, lambda k: health(k, GPU, victim) == "Healthy", WAIT * 2)
    assert SHORT.gpu_hold_s <= took < SHORT.gpu_hold_s + FAULT_SEEN_WITHIN * 2
    assert listed(GPU, 8, healthy=7)(kubelet)


async def test_lost_gpu_turns_unhealthy(
    agent: RunningAgent, kubelet: Kubelet, node_doc: dict[str, Any], edit_node: EditNode
) -> None:
    await kubelet.wait_until(everything_listed, WAIT)
    victim = node_doc["gpus"][6]["uuid"]

    edit_node(lambda d: d["gpus"][6].__setitem__("lost", True))

    took = await timed_wait(kubelet, lambda k: health(k, GPU, victim) == "Unhealthy", WAIT)
    assert took < FAULT_SEEN_WITHIN


async def test_nic_link_down_turns_unhealthy_and_up_healthy_again(
    agent: RunningAgent, kubelet: Kubelet, node_doc: dict[str, Any], edit_node: EditNode
) -> None:
    await kubelet.wait_until(everything_listed, WAIT)
    victim = node_doc["nics"][2]["pci"]

    edit_node(lambda d: d["nics"][2].__setitem__("link", "down"))
    took = await timed_wait(kubelet, lambda k: health(k, NIC, victim) == "Unhealthy", WAIT)
    assert took < FAULT_SEEN_WITHIN
    assert listed(NIC, 8, healthy=7)(kubelet)

    edit_node(lambda d: d["nics"][2].__setitem__("link", "up"))
    # A flap right after a reported change is held back for the flap hold, by design.
    took = await timed_wait(kubelet, lambda k: health(k, NIC, victim) == "Healthy", WAIT)
    assert took < SHORT.nic_flap_hold_s + FAULT_SEEN_WITHIN
    assert listed(NIC, 8)(kubelet)


async def test_removed_gpu_disappears_from_the_list(
    agent: RunningAgent, kubelet: Kubelet, node_doc: dict[str, Any], edit_node: EditNode
) -> None:
    await kubelet.wait_until(everything_listed, WAIT)
    gpu = node_doc["gpus"][7]
    removed = gpu["uuid"]

    def take_out(doc: dict[str, Any]) -> None:
        doc["gpus"].pop(7)
        for other in doc["gpus"]:
            other["nvlinks"] = [p for p in other["nvlinks"] if p != removed]

    edit_node(take_out)

    await kubelet.wait_until(listed(GPU, 7), FAULT_SEEN_WITHIN * 2)
    view = kubelet.resource(GPU)
    assert view is not None
    assert removed not in view.devices

    # Put back (a GPU reseated after a fault), it is offered again at once, and Healthy
    # once it has answered normally for the hold time.
    edit_node(lambda d: d["gpus"].append(gpu))
    await kubelet.wait_until(listed(GPU, 8, healthy=7), FAULT_SEEN_WITHIN * 2)
    await kubelet.wait_until(listed(GPU, 8), SHORT.gpu_hold_s + FAULT_SEEN_WITHIN * 2)
    assert health(kubelet, GPU, removed) == "Healthy"


# Sockets and resources


async def test_plugin_sockets_are_mode_0600(agent: RunningAgent, kubelet: Kubelet) -> None:
    await kubelet.wait_until(everything_listed, WAIT)
    for path in agent.sockets:
        mode = path.stat().st_mode
        assert stat.S_ISSOCK(mode)
        assert stat.S_IMODE(mode) == 0o600


async def test_agent_stop_removes_its_sockets_and_the_kubelet_sees_it_gone(
    agent: RunningAgent, kubelet: Kubelet, plugin_dir: Path
) -> None:
    await kubelet.wait_until(everything_listed, WAIT)

    await agent.stop()
    await agent.stop()

    assert plugin_sockets(plugin_dir) == []
    await kubelet.wait_until(lambda k: k.allocatable() == {GPU: 0, NIC: 0}, WAIT)


MIXED = "version: v1\nflags: {migStrategy: mixed}\n"


def _mig_on_two_gpus(doc: dict[str, Any]) -> None:
    for i, profile in ((0, "1g.10gb"), (1, "3g.40gb")):
        doc["gpus"][i]["mig"] = {
            "enabled": True,
            "instances": [
                {"uuid": f"MIG-{i}{n}000000-0000-0000-0000-000000000000", "profile": profile}
                for n in range(2)
            ],
        }


async def test_many_resources_are_served_and_registered_by_one_process(
    node_file: Path, plugin_dir: Path, edit_node: EditNode, kubelet: Kubelet
) -> None:
    edit_node(_mig_on_two_gpus)
    config = parse_config(MIXED, "<test>")

    async with running(node_file, plugin_dir, config) as handle:
        await kubelet.wait_until(
            lambda k: (
                listed(GPU, 6)(k)
                and listed("nvidia.com/mig-1g.10gb", 2)(k)
                and listed("nvidia.com/mig-3g.40gb", 2)(k)
                and listed(NIC, 8)(k)
            ),
            WAIT,
        )
        assert len({p.name for p in handle.sockets}) == 4


# Admission


async def test_pod_with_two_gpus_and_two_nics_gets_paired_devices_and_envs(
    agent: RunningAgent, kubelet: Kubelet, node_doc: dict[str, Any]
) -> None:
    await kubelet.wait_until(everything_listed, WAIT)

    allocation = await kubelet.admit(Pod("trainer", [Container("train", {GPU: 2, NIC: 2})]))

    got = allocation.containers["train"]
    gpus, nics = got.devices[GPU], got.devices[NIC]
    assert len(gpus) == len(nics) == 2
    assert sorted(got.responses[GPU].envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(gpus)
    by_pci = {n["pci"]: n for n in node_doc["nics"]}
    envs = got.responses[NIC].envs
    hcas, netdevs = envs["NCCL_IB_HCA"], envs["RDMA_NETDEVS"].split(",")
    assert hcas.startswith("=")
    # Position by position, each HCA and its netdev are those of one allocated NIC.
    pairs = zip(hcas.removeprefix("=").split(","), netdevs, strict=True)
    assert sorted(pairs) == sorted((f"{by_pci[p]['rdma']}:1", by_pci[p]["netdev"]) for p in nics)
    uverbs = {f"/dev/infiniband/uverbs{by_pci[p]['rdma'].removeprefix('mlx5_')}" for p in nics}
    paths = [d.container_path for d in got.responses[NIC].devices]
    assert sorted(paths) == sorted([*uverbs, "/dev/infiniband/rdma_cm"])
    # Each GPU's switch (the bridge below its root port) also holds one of the NICs.
    switch = {g["uuid"]: g["upstream"][1] for g in node_doc["gpus"]}
    assert sorted(switch[g] for g in gpus) == sorted(by_pci[p]["upstream"][1] for p in nics)
