"""Acceptance: a kubelet client written from the public v1beta1 API alone, against
`node-agent run --simulate` as a real process. Nothing here knows the agent's insides."""

from __future__ import annotations

import asyncio
import os
import re
import stat
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from agents.api import api_pb2 as pb
from agents.api import api_pb2_grpc as pb_grpc
from tests.conditions import WAIT, async_wait_until
from tests.integration.conftest import AgentProcess

GPU = "nvidia.com/gpu"
NIC = "rdma/roce"
REGISTERED_WITHIN = 2.0  # from process start
REREGISTERED_WITHIN = 1.0  # from the new kubelet.sock

StartAgent = Callable[[Sequence[str]], AgentProcess]


class RegistrationServer(pb_grpc.RegistrationServicer):  # type: ignore[misc]
    """v1beta1.Registration on <dir>/kubelet.sock (0600); records every Register."""

    def __init__(self, plugin_dir: Path) -> None:
        self.socket = plugin_dir / "kubelet.sock"
        self.requests: list[tuple[float, Any]] = []  # (monotonic time, RegisterRequest)
        self._server: Any = None

    async def start(self) -> float:
        """Serve; returns the monotonic time at which kubelet.sock was in place."""
        server = grpc.aio.server()
        pb_grpc.add_RegistrationServicer_to_server(self, server)
        old_umask = os.umask(0o177)
        try:
            server.add_insecure_port(f"unix://{self.socket}")
        finally:
            os.umask(old_umask)
        await server.start()
        self.socket.chmod(0o600)
        self._server = server
        return time.monotonic()

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop(None)

    async def Register(self, request: Any, context: Any) -> Any:
        self.requests.append((time.monotonic(), request))
        return pb.Empty()

    def latest(self, since: int = 0) -> dict[str, tuple[float, Any]]:
        """The last Register of each resource among requests[since:]."""
        return {r.resource_name: (t, r) for t, r in self.requests[since:]}

    async def wait_registered(
        self, agent: AgentProcess, since: int = 0, within: float = WAIT
    ) -> dict[str, Any]:
        """Both resources registered after requests[since]; returns resource -> request."""
        await async_wait_until(
            lambda: {GPU, NIC} <= self.latest(since).keys() or not agent.alive(),
            within,
            "Register of both resources",
        )
        assert agent.alive(), f"the agent exited: {agent.stderr}"
        return {name: r for name, (_, r) in self.latest(since).items()}


class Client:
    """The kubelet's side of one plugin endpoint."""

    def __init__(self, socket: Path) -> None:
        self.channel = grpc.aio.insecure_channel(f"unix://{socket}")
        self.stub = pb_grpc.DevicePluginStub(self.channel)

    async def first_list(self) -> list[Any]:
        call = self.stub.ListAndWatch(pb.Empty())
        try:
            message = await asyncio.wait_for(call.read(), WAIT)
        finally:
            call.cancel()
        return list(message.devices)

    async def allocate(self, ids: Sequence[str]) -> Any:
        request = pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devicesIDs=list(ids))]
        )
        response = await self.stub.Allocate(request, timeout=WAIT)
        (container,) = response.container_responses
        return container

    async def preferred(self, available: Sequence[str], must: Sequence[str], size: int) -> Any:
        request = pb.PreferredAllocationRequest(
            container_requests=[
                pb.ContainerPreferredAllocationRequest(
                    available_deviceIDs=list(available),
                    must_include_deviceIDs=list(must),
                    allocation_size=size,
                )
            ]
        )
        response = await self.stub.GetPreferredAllocation(request, timeout=WAIT)
        return response.container_responses[0]


class Session:
    """A running agent registered with our Registration server, with a client per resource."""

    def __init__(self, agent: AgentProcess, kubelet: RegistrationServer, plugin_dir: Path) -> None:
        self.agent = agent
        self.kubelet = kubelet
        self.plugin_dir = plugin_dir
        self.requests: dict[str, Any] = {}
        self.clients: dict[str, Client] = {}
        self.registered_after = 0.0

    async def registered(self) -> Session:
        self.requests = await self.kubelet.wait_registered(self.agent)
        self.registered_after = max(t for t, _ in self.kubelet.latest().values())
        self.registered_after -= self.agent.started
        self.connect()
        return self

    def connect(self) -> None:
        self.clients = {
            name: Client(self.plugin_dir / request.endpoint)
            for name, request in self.requests.items()
        }

    async def close(self) -> None:
        for client in self.clients.values():
            await client.channel.close()


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[RegistrationServer]:
    server = RegistrationServer(plugin_dir)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def session(
    start_agent: StartAgent, kubelet: RegistrationServer, plugin_dir: Path, node_file: Path
) -> AsyncIterator[Session]:
    agent = start_agent(
        ["run", "--simulate", str(node_file), "--device-plugin-dir", str(plugin_dir)]
    )
    running = Session(agent, kubelet, plugin_dir)
    try:
        yield await running.registered()
    finally:
        await running.close()


def plugin_sockets(directory: Path) -> list[Path]:
    return sorted(directory.glob("node-agent-*.sock"))


def remove_sockets(directory: Path) -> None:
    for path in directory.iterdir():
        if stat.S_ISSOCK(path.lstat().st_mode):
            path.unlink()


def by_id(devices: Sequence[Any]) -> dict[str, Any]:
    return {d.ID: d for d in devices}


# Registration


async def test_both_resources_register_within_two_seconds_of_process_start(
    session: Session,
) -> None:
    print(f"registered both resources {session.registered_after * 1000:.0f} ms after spawn")
    assert session.registered_after < REGISTERED_WITHIN
    assert session.agent.alive()


async def test_registration_names_a_0600_root_socket_in_the_directory_and_v1beta1(
    session: Session, plugin_dir: Path
) -> None:
    for name in (GPU, NIC):
        request = session.requests[name]
        assert request.version == "v1beta1"
        assert "/" not in request.endpoint
        info = (plugin_dir / request.endpoint).stat()
        assert stat.S_ISSOCK(info.st_mode)
        assert stat.S_IMODE(info.st_mode) == 0o600
        assert info.st_uid == 0
    assert session.requests[GPU].endpoint != session.requests[NIC].endpoint


async def test_options_offer_preferred_allocation(session: Session) -> None:
    for client in session.clients.values():
        options = await client.stub.GetDevicePluginOptions(pb.Empty(), timeout=WAIT)
        assert options.get_preferred_allocation_available


# ListAndWatch


async def test_list_and_watch_lists_gpus_by_uuid_with_their_numa_node(
    session: Session, node_doc: dict[str, Any]
) -> None:
    devices = by_id(await session.clients[GPU].first_list())

    expected = {g["uuid"]: g["numa"] for g in node_doc["gpus"]}
    assert len(expected) == 8
    assert devices.keys() == expected.keys()
    for uuid, device in devices.items():
        assert uuid.startswith("GPU-")
        assert device.health == "Healthy"
        assert [n.ID for n in device.topology.nodes] == [expected[uuid]]


async def test_list_and_watch_lists_nics_by_pci_address_with_their_numa_node(
    session: Session, node_doc: dict[str, Any]
) -> None:
    devices = by_id(await session.clients[NIC].first_list())

    expected = {n["pci"]: n["numa"] for n in node_doc["nics"]}
    assert len(expected) == 8
    assert devices.keys() == expected.keys()
    for pci, device in devices.items():
        assert re.fullmatch(r"0000:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]", pci)
        assert device.health == "Healthy"
        assert [n.ID for n in device.topology.nodes] == [expected[pci]]


# Allocate


async def test_allocate_two_gpus_sets_visible_devices_to_exactly_their_uuids(
    session: Session, node_doc: dict[str, Any]
) -> None:
    chosen = [node_doc["gpus"][5]["uuid"], node_doc["gpus"][2]["uuid"]]

    response = await session.clients[GPU].allocate(chosen)

    assert sorted(response.envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == sorted(chosen)


async def test_allocate_two_nics_passes_their_uverbs_rdma_cm_and_exact_hca_names(
    session: Session, node_doc: dict[str, Any]
) -> None:
    nics = [node_doc["nics"][0], node_doc["nics"][3]]

    response = await session.clients[NIC].allocate([n["pci"] for n in nics])

    uverbs = [f"/dev/infiniband/uverbs{n['rdma'].removeprefix('mlx5_')}" for n in nics]
    specs = {d.container_path: d for d in response.devices}
    assert sorted(specs) == sorted([*uverbs, "/dev/infiniband/rdma_cm"])
    for container_path, spec in specs.items():
        assert spec.host_path != container_path
        assert spec.host_path.endswith(container_path)  # under the simulator's root
        assert stat.S_ISCHR(os.stat(spec.host_path).st_mode)
    assert response.envs["NCCL_IB_HCA"] == "=" + ",".join(f"{n['rdma']}:1" for n in nics)
    assert response.envs["RDMA_NETDEVS"].split(",") == [n["netdev"] for n in nics]


# Refusals: the right code, the agent stays up


def _unknown(doc: dict[str, Any]) -> tuple[str, list[str]]:
    return "Allocate", ["GPU-00000000-0000-0000-0000-000000000000"]


def _empty(doc: dict[str, Any]) -> tuple[str, list[str]]:
    return "Allocate", []


def _duplicate(doc: dict[str, Any]) -> tuple[str, list[str]]:
    uuid = doc["gpus"][0]["uuid"]
    return "Allocate", [uuid, uuid]


REFUSED_ALLOCATIONS = [_unknown, _empty, _duplicate]


@pytest.mark.parametrize("request_of", REFUSED_ALLOCATIONS, ids=["unknown", "empty", "duplicate"])
async def test_bad_allocate_is_invalid_argument_and_the_agent_keeps_answering(
    session: Session, node_doc: dict[str, Any], request_of: Callable[..., Any]
) -> None:
    _, ids = request_of(node_doc)
    client = session.clients[GPU]

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.allocate(ids)

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    if ids:
        assert ids[0] in (refused.value.details() or "")
    await still_answers(session, node_doc)


def _gpus(doc: dict[str, Any], *indices: int) -> list[str]:
    return [doc["gpus"][i]["uuid"] for i in indices]


PREFERRED_REFUSALS: dict[str, Callable[[dict[str, Any]], tuple[list[str], list[str], int]]] = {
    "size-above-available": lambda d: (_gpus(d, 0, 1), [], 3),
    "must-include-not-available": lambda d: (_gpus(d, 0, 1), _gpus(d, 2), 2),
    "negative-size": lambda d: (_gpus(d, 0, 1), [], -1),
    "unknown-available": lambda d: (["GPU-nope"], [], 1),
    "duplicate-available": lambda d: (_gpus(d, 0, 0), [], 1),
}


@pytest.mark.parametrize("case", sorted(PREFERRED_REFUSALS))
async def test_bad_preferred_allocation_is_invalid_argument_and_the_agent_keeps_answering(
    session: Session, node_doc: dict[str, Any], case: str
) -> None:
    available, must, size = PREFERRED_REFUSALS[case](node_doc)

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await session.clients[GPU].preferred(available, must, size)

    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    await still_answers(session, node_doc)


async def still_answers(session: Session, doc: dict[str, Any]) -> None:
    assert session.agent.alive()
    good = await session.clients[GPU].preferred(_gpus(doc, 0, 1, 2, 3), [], 2)
    assert len(good.deviceIDs) == 2
    assert len(await session.clients[NIC].first_list()) == 8


async def test_allocate_of_an_unhealthy_gpu_is_failed_precondition_naming_it(
    session: Session, node_doc: dict[str, Any], edit_node: Callable[..., None]
) -> None:
    victim = node_doc["gpus"][4]["uuid"]
    client = session.clients[GPU]
    call = client.stub.ListAndWatch(pb.Empty())
    try:
        edit_node(lambda d: d["gpus"][4]["xids"].append(79))
        while by_id((await asyncio.wait_for(call.read(), WAIT)).devices)[victim].health != (
            "Unhealthy"
        ):
            pass
    finally:
        call.cancel()

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await client.allocate([victim])

    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert victim in (refused.value.details() or "")
    await still_answers(session, node_doc)


# Kubelet restart and shutdown


async def test_kubelet_restart_leads_to_registration_within_a_second_and_a_fresh_list(
    session: Session, kubelet: RegistrationServer, plugin_dir: Path
) -> None:
    watching = session.clients[GPU].stub.ListAndWatch(pb.Empty())
    await asyncio.wait_for(watching.read(), WAIT)  # a stream open, as the kubelet keeps one
    await kubelet.stop()
    remove_sockets(plugin_dir)  # as a starting kubelet does
    seen = len(kubelet.requests)

    restarted = await kubelet.start()
    session.requests = await kubelet.wait_registered(session.agent, since=seen)
    took = max(t for t, _ in kubelet.latest(seen).values()) - restarted

    print(f"registered again {took * 1000:.0f} ms after the new kubelet.sock")
    assert took < REREGISTERED_WITHIN
    watching.cancel()
    await session.close()
    session.connect()
    assert len(await session.clients[GPU].first_list()) == 8
    assert len(await session.clients[NIC].first_list()) == 8


async def test_sigterm_exits_0_and_removes_the_plugin_sockets(
    session: Session, plugin_dir: Path
) -> None:
    stream = session.clients[NIC].stub.ListAndWatch(pb.Empty())
    await asyncio.wait_for(stream.read(), WAIT)

    started = time.monotonic()
    code = await asyncio.to_thread(session.agent.terminate, WAIT)

    print(f"exit code {code} {(time.monotonic() - started) * 1000:.0f} ms after SIGTERM")
    assert code == 0, session.agent.stderr
    assert plugin_sockets(plugin_dir) == []
    stream.cancel()


# Usage and configuration errors


def _exit(start_agent: StartAgent, args: Sequence[str]) -> tuple[int, str]:
    agent = start_agent(args)
    return agent.process.wait(WAIT * 2), agent.stderr


async def test_config_error_exits_2_with_one_line_naming_the_file_and_key(
    start_agent: StartAgent, tmp_path: Path, node_file: Path, plugin_dir: Path
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\nflags: {migStrategy: bogus}\n")
    run = ["run", "--config", str(config), "--simulate", str(node_file)]

    code, stderr = await asyncio.to_thread(
        _exit, start_agent, [*run, "--device-plugin-dir", str(plugin_dir)]
    )

    assert code == 2
    (line,) = stderr.splitlines()
    assert str(config) in line
    assert "migStrategy" in line
    assert "bogus" in line


async def test_unknown_family_exits_2(
    start_agent: StartAgent, node_file: Path, plugin_dir: Path
) -> None:
    args = ["run", "--families", "gpu,fpga", "--simulate", str(node_file)]

    code, stderr = await asyncio.to_thread(
        _exit, start_agent, [*args, "--device-plugin-dir", str(plugin_dir)]
    )

    assert code == 2
    (line,) = stderr.splitlines()
    assert "--families" in line
    assert "fpga" in line
    assert plugin_sockets(plugin_dir) == []


async def test_plugin_dir_too_long_for_unix_sockets_exits_2(
    start_agent: StartAgent, node_file: Path, tmp_path: Path
) -> None:
    deep = tmp_path / ("d" * 100)
    args = ["run", "--simulate", str(node_file), "--device-plugin-dir", str(deep)]

    code, stderr = await asyncio.to_thread(_exit, start_agent, args)

    assert code == 2
    line = stderr.splitlines()[-1]
    assert "--device-plugin-dir" in line
    assert "107 bytes" in line
    assert "Traceback" not in stderr
    assert not any(deep.glob("*.sock"))
