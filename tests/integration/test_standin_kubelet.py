"""The kubelet stand-in against a scripted plugin, over real gRPC on unix sockets."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import stat
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog.testing

from agents.api import api_pb2, api_pb2_grpc
from agents.kernel.kubelet_facts import PodResources, listing_of
from agents.standin.kubelet import AdmissionError, Container, Kubelet, Pod
from tests.conditions import WAIT, async_wait_until

GPU = "example.com/gpu"
NIC = "example.com/nic"
FPGA = "example.com/fpga"

Preferred = Callable[[list[str], list[str], int], list[str]]


def read_checkpoint(path: Path) -> dict[str, Any]:
    """The checkpoint document the stand-in last wrote."""
    document: dict[str, Any] = json.loads(path.read_text())
    return document


def _first_sorted(available: list[str], must_include: list[str], size: int) -> list[str]:
    rest = sorted(set(available) - set(must_include))
    return [*must_include, *rest][:size]


class FakePlugin:
    """A DevicePlugin servicer on its own socket: scripted answers, every call recorded."""

    def __init__(self, path: Path, resource: str, devices: Mapping[str, str]) -> None:
        self.socket = path
        self.resource = resource
        self.devices = dict(devices)  # id -> health
        self.preferred_available = True
        self.preferred: Preferred = _first_sorted
        self.errors: dict[str, tuple[grpc.StatusCode, str]] = {}  # method -> abort status
        self.calls: list[tuple[str, Any]] = []
        # The checkpoint file as each Allocate found it: a rename between two calls shows.
        self.checkpoints_seen: list[bytes | None] = []
        self.streams_opened = 0
        self.streams_closed = 0
        self._version = 0
        self._end_streams = False
        self._changed = asyncio.Event()
        self._server: Any = None

    async def start(self) -> None:
        self._server = grpc.aio.server()
        api_pb2_grpc.add_DevicePluginServicer_to_server(self, self._server)
        self._server.add_insecure_port(f"unix://{self.socket}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    async def register(self, kubelet_dir: Path, version: str = "v1beta1") -> None:
        async with grpc.aio.insecure_channel(f"unix://{kubelet_dir / 'kubelet.sock'}") as channel:
            await api_pb2_grpc.RegistrationStub(channel).Register(
                api_pb2.RegisterRequest(
                    version=version,
                    endpoint=self.socket.name,
                    resource_name=self.resource,
                    # Deliberately the opposite of the real answer: the kubelet must ask.
                    options=api_pb2.DevicePluginOptions(
                        get_preferred_allocation_available=not self.preferred_available
                    ),
                )
            )

    def set_devices(self, devices: Mapping[str, str]) -> None:
        self.devices = dict(devices)
        self._bump()

    def end_streams(self, end: bool = True) -> None:
        """Return from every ListAndWatch (and from new ones) until called with False."""
        self._end_streams = end
        self._bump()

    def called(self, method: str) -> list[Any]:
        return [request for name, request in self.calls if name == method]

    def _bump(self) -> None:
        self._version += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def _maybe_abort(self, method: str, context: Any) -> None:
        if method in self.errors:
            await context.abort(*self.errors[method])

    async def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        self.calls.append(("GetDevicePluginOptions", request))
        await self._maybe_abort("GetDevicePluginOptions", context)
        return api_pb2.DevicePluginOptions(
            get_preferred_allocation_available=self.preferred_available
        )

    async def ListAndWatch(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.streams_opened += 1
        try:
            sent = -1
            while not self._end_streams:
                if sent != self._version:
                    sent, changed = self._version, self._changed
                    yield api_pb2.ListAndWatchResponse(
                        devices=[
                            api_pb2.Device(
                                ID=device_id,
                                health=health,
                                topology=api_pb2.TopologyInfo(nodes=[api_pb2.NUMANode(ID=1)]),
                            )
                            for device_id, health in sorted(self.devices.items())
                        ]
                    )
                await changed.wait()
        finally:
            self.streams_closed += 1

    async def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        self.calls.append(("GetPreferredAllocation", request))
        await self._maybe_abort("GetPreferredAllocation", context)
        answers = [
            api_pb2.ContainerPreferredAllocationResponse(
                deviceIDs=self.preferred(
                    list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size
                )
            )
            for r in request.container_requests
        ]
        return api_pb2.PreferredAllocationResponse(container_responses=answers)

    async def Allocate(self, request: Any, context: Any) -> Any:
        self.calls.append(("Allocate", request))
        checkpoint = self.socket.parent / "kubelet_internal_checkpoint"
        self.checkpoints_seen.append(checkpoint.read_bytes() if checkpoint.exists() else None)
        await self._maybe_abort("Allocate", context)
        answers = [
            api_pb2.ContainerAllocateResponse(
                envs={f"{self.socket.stem.upper()}_IDS": ",".join(sorted(r.devicesIDs))}
            )
            for r in request.container_requests
        ]
        return api_pb2.AllocateResponse(container_responses=answers)

    async def PreStartContainer(self, request: Any, context: Any) -> Any:
        self.calls.append(("PreStartContainer", request))
        return api_pb2.PreStartContainerResponse()


PluginFactory = Callable[..., Awaitable[FakePlugin]]


def healthy(*ids: str) -> dict[str, str]:
    return dict.fromkeys(ids, "Healthy")


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[Kubelet]:
    kubelet = Kubelet(tmp_path, seed=7)
    await kubelet.start()
    yield kubelet
    await kubelet.stop()


@pytest.fixture
async def plugin(tmp_path: Path) -> AsyncIterator[PluginFactory]:
    started: list[FakePlugin] = []

    async def make(name: str, resource: str, devices: Mapping[str, str]) -> FakePlugin:
        fake = FakePlugin(tmp_path / f"{name}.sock", resource, devices)
        await fake.start()
        started.append(fake)
        return fake

    yield make
    for fake in started:
        await fake.stop()


async def registered(kubelet: Kubelet, fake: FakePlugin) -> FakePlugin:
    """Register and wait for the device list sent on the new stream."""
    before = kubelet.resource(fake.resource)
    updates = before.updates if before is not None else 0
    await fake.register(kubelet.plugin_dir)
    await kubelet.wait_until(
        lambda k: (
            (view := k.resource(fake.resource)) is not None
            and view.connected
            and view.endpoint == fake.socket.name
            and view.updates > updates
        ),
        WAIT,
    )
    return fake


# Registration


async def test_register_dials_back_and_reads_options_before_answering(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    fake = await plugin("gpu", GPU, healthy("g0"))
    await fake.register(kubelet.plugin_dir)

    # Register has returned: the options were read within it.
    assert [name for name, _ in fake.calls] == ["GetDevicePluginOptions"]
    (registration,) = kubelet.registrations
    assert (registration.resource_name, registration.endpoint, registration.version) == (
        GPU,
        "gpu.sock",
        "v1beta1",
    )
    assert registration.error is None
    view = kubelet.resource(GPU)
    assert view is not None
    assert view.options.get_preferred_allocation_available  # the answer, not the request
    await kubelet.wait_until(lambda k: fake.streams_opened == 1, WAIT)


async def test_register_with_unsupported_version_is_refused(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    fake = await plugin("gpu", GPU, healthy("g0"))
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await fake.register(kubelet.plugin_dir, version="v1alpha")

    assert refused.value.code() == grpc.StatusCode.UNKNOWN
    assert "v1alpha" in (refused.value.details() or "")
    assert kubelet.registrations[-1].error is not None
    assert kubelet.resource(GPU) is None
    assert fake.calls == []


async def test_register_fails_when_get_device_plugin_options_fails(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    fake = await plugin("gpu", GPU, healthy("g0"))
    fake.errors["GetDevicePluginOptions"] = (grpc.StatusCode.INTERNAL, "not ready")

    with pytest.raises(grpc.aio.AioRpcError, match="not ready"):
        await fake.register(kubelet.plugin_dir)

    assert kubelet.resource(GPU) is None
    assert fake.streams_opened == 0


# ListAndWatch


async def test_each_list_and_watch_message_replaces_the_device_list(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    fake = await registered(kubelet, await plugin("gpu", GPU, healthy("g0", "g1")))
    view = kubelet.resource(GPU)
    assert view is not None
    assert view.devices["g0"].numa == (1,)
    assert (kubelet.capacity(), kubelet.allocatable()) == ({GPU: 2}, {GPU: 2})

    fake.set_devices({"g1": "Unhealthy", "g2": "Healthy"})
    await kubelet.wait_until(lambda k: view.updates == 2, WAIT)

    assert {d: s.health for d, s in view.devices.items()} == {"g1": "Unhealthy", "g2": "Healthy"}
    assert (kubelet.capacity(), kubelet.allocatable()) == ({GPU: 2}, {GPU: 1})


async def test_reregistration_closes_the_old_stream_and_uses_the_new_endpoint(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    old = await registered(kubelet, await plugin("old", GPU, healthy("g0")))
    new = await plugin("new", GPU, healthy("g0", "g1"))

    await registered(kubelet, new)

    assert old.streams_closed == 1
    view = kubelet.resource(GPU)
    assert view is not None
    assert view.endpoint == "new.sock"
    assert view.connected
    assert kubelet.allocatable() == {GPU: 2}


async def test_stream_ended_by_plugin_marks_devices_unhealthy_until_it_registers_again(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    fake = await registered(kubelet, await plugin("gpu", GPU, healthy("g0", "g1")))

    fake.end_streams()
    await kubelet.wait_until(lambda k: k.allocatable() == {GPU: 0}, WAIT)

    view = kubelet.resource(GPU)
    assert view is not None
    assert not view.connected
    assert {s.health for s in view.devices.values()} == {"Unhealthy"}
    assert (kubelet.capacity(), kubelet.allocatable()) == ({GPU: 2}, {GPU: 0})
    assert fake.streams_opened == 1  # the kubelet did not dial again by itself

    fake.end_streams(False)
    await registered(kubelet, fake)
    assert kubelet.allocatable() == {GPU: 2}
    assert fake.streams_opened == 2


async def test_plugin_server_stopping_marks_devices_unhealthy(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    fake = await registered(kubelet, await plugin("gpu", GPU, healthy("g0")))

    await fake.stop()

    await kubelet.wait_until(lambda k: k.allocatable() == {GPU: 0}, WAIT)
    assert kubelet.capacity() == {GPU: 1}


# Life cycle


async def test_start_serves_kubelet_socket_with_mode_0600(kubelet: Kubelet) -> None:
    mode = kubelet.socket_path.stat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600


async def test_stop_removes_kubelet_socket_and_is_idempotent(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    fake = await registered(kubelet, await plugin("gpu", GPU, healthy("g0")))

    await kubelet.stop()
    await kubelet.stop()

    assert not kubelet.socket_path.exists()
    assert not kubelet.running
    await async_wait_until(lambda: fake.streams_closed == 1, WAIT, "stream cancelled")


async def test_restart_deletes_sockets_keeps_checkpoint_and_allocations(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    fake = await registered(kubelet, await plugin("gpu", GPU, healthy("g0", "g1")))
    allocation = await kubelet.admit(Pod("p", [Container("c", {GPU: 1})]))
    notes = kubelet.plugin_dir / "notes.txt"
    notes.write_text("not a socket")
    checkpoint = kubelet.checkpoint_path.read_bytes()

    await kubelet.restart()

    assert sorted(p.name for p in kubelet.plugin_dir.iterdir()) == [
        "kubelet.sock",
        "kubelet_internal_checkpoint",
        "notes.txt",
    ]
    assert kubelet.checkpoint_path.read_bytes() == checkpoint
    assert kubelet.allocated() == {GPU: set(allocation.devices("c", GPU))}
    # Until the plugin registers again the node shows none of its devices.
    assert kubelet.capacity() == {GPU: 0}

    await fake.stop()  # its socket file is gone: serve it again, as a plugin does
    fresh = await plugin("gpu", GPU, healthy("g0", "g1"))
    await registered(kubelet, fresh)
    assert kubelet.allocatable() == {GPU: 2}


async def test_disconnected_resource_is_dropped_after_the_grace_period(
    tmp_path: Path, plugin: PluginFactory
) -> None:
    now = [100.0]
    kubelet = Kubelet(tmp_path, grace_period=300.0, clock=lambda: now[0])
    await kubelet.start()
    try:
        fake = await registered(kubelet, await plugin("gpu", GPU, healthy("g0")))
        fake.end_streams()
        await kubelet.wait_until(lambda k: k.allocatable() == {GPU: 0}, WAIT)

        now[0] += 300.0
        assert kubelet.capacity() == {GPU: 1}
        now[0] += 1.0
        assert kubelet.capacity() == {}
        assert kubelet.resource(GPU) is None
    finally:
        await kubelet.stop()


# Admission


async def test_admit_asks_preferred_then_allocates_and_renames_checkpoint_once_per_container(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    gpu = await registered(kubelet, await plugin("gpu", GPU, healthy("g0", "g1", "g2", "g3")))
    nic = await registered(kubelet, await plugin("nic", NIC, healthy("n0", "n1")))
    pod = Pod(
        "p",
        [
            Container("both", {GPU: 2, NIC: 1, "cpu": 4}),
            Container("plain", {"cpu": 1}),
            Container("one", {GPU: 1}),
        ],
    )
    writes = kubelet.checkpoint_writes  # one per device-list update so far
    allocation = await kubelet.admit(pod)

    assert kubelet.checkpoint_writes == writes + 2
    # GPU and NIC of "both" saw one file; "one" saw the rename after "both"; then one more.
    both_gpu, one_gpu = gpu.checkpoints_seen
    (both_nic,) = nic.checkpoints_seen
    assert both_gpu == both_nic
    assert one_gpu not in (None, both_gpu)
    assert kubelet.checkpoint_path.read_bytes() not in (None, one_gpu)
    assert [name for name, _ in gpu.calls[1:]] == ["GetPreferredAllocation", "Allocate"] * 2
    assert [name for name, _ in nic.calls[1:]] == ["GetPreferredAllocation", "Allocate"]
    both = allocation.containers["both"]
    assert sorted(both.devices[GPU]) == ["g0", "g1"]  # the plugin's preference
    assert both.responses[GPU].envs["GPU_IDS"] == "g0,g1"
    assert len(both.devices[NIC]) == 1
    assert allocation.containers["plain"].devices == {}
    assert allocation.devices("one", GPU) == ["g2"]
    assert kubelet.allocated() == {GPU: {"g0", "g1", "g2"}, NIC: set(both.devices[NIC])}
    entries = read_checkpoint(kubelet.checkpoint_path)["Data"]["PodDeviceEntries"]
    assert {(e["ContainerName"], e["ResourceName"]) for e in entries} == {
        ("both", GPU),
        ("both", NIC),
        ("one", GPU),
    }


async def test_preferred_request_offers_free_healthy_devices_and_the_whole_size(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    devices = {**healthy("g0", "g1", "g2", "g3"), "g4": "Unhealthy"}
    gpu = await registered(kubelet, await plugin("gpu", GPU, devices))
    await kubelet.admit(Pod("first", [Container("c", {GPU: 1})]))

    await kubelet.admit(Pod("second", [Container("c", {GPU: 2})]))

    request = gpu.called("GetPreferredAllocation")[-1].container_requests[0]
    assert sorted(request.available_deviceIDs) == ["g1", "g2", "g3"]
    assert list(request.must_include_deviceIDs) == []
    assert request.allocation_size == 2


async def test_preferred_answer_shortfall_is_filled_from_free_devices(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    gpu = await registered(kubelet, await plugin("gpu", GPU, healthy("g0", "g1", "g2")))
    gpu.preferred = lambda available, must, size: ["g2", "unknown"]

    allocation = await kubelet.admit(Pod("p", [Container("c", {GPU: 2})]))

    chosen = allocation.devices("c", GPU)
    assert "g2" in chosen
    assert len(chosen) == 2
    assert set(chosen) <= {"g0", "g1", "g2"}
    assert sorted(gpu.called("Allocate")[0].container_requests[0].devicesIDs) == sorted(chosen)


async def test_no_preferred_call_when_plugin_or_kubelet_does_not_use_it(
    tmp_path: Path, plugin: PluginFactory
) -> None:
    kubelet = Kubelet(tmp_path, seed=1, use_preferred=False)
    await kubelet.start()
    try:
        gpu = await registered(kubelet, await plugin("gpu", GPU, healthy("g0", "g1")))
        nic = await plugin("nic", NIC, healthy("n0"))
        nic.preferred_available = False
        await registered(kubelet, nic)

        await kubelet.admit(Pod("p", [Container("c", {GPU: 1, NIC: 1})]))

        assert gpu.called("GetPreferredAllocation") == []
        assert nic.called("GetPreferredAllocation") == []
        assert len(gpu.called("Allocate")) == len(nic.called("Allocate")) == 1
    finally:
        await kubelet.stop()


async def _resource_orders(directory: Path, seed: int) -> list[list[str]]:
    kubelet = Kubelet(directory, seed=seed)
    await kubelet.start()  # creates the directory
    fakes = [
        FakePlugin(directory / f"{n}.sock", resource, healthy(*(f"{n}{i}" for i in range(8))))
        for n, resource in (("gpu", GPU), ("nic", NIC), ("fpga", FPGA))
    ]
    try:
        for fake in fakes:
            await fake.start()
            await registered(kubelet, fake)
        limits = {GPU: 1, NIC: 1, FPGA: 1}
        pod = Pod("p", [Container(f"c{i}", limits) for i in range(8)])
        allocation = await kubelet.admit(pod)
        return [allocation.containers[f"c{i}"].order for i in range(8)]
    finally:
        await kubelet.stop()
        for fake in fakes:
            await fake.stop()


async def test_resource_order_is_reshuffled_per_container_and_fixed_by_the_seed(
    tmp_path: Path,
) -> None:
    orders = await _resource_orders(tmp_path / "a", seed=3)
    again = await _resource_orders(tmp_path / "b", seed=3)

    assert orders == again
    assert len({tuple(order) for order in orders}) > 1
    assert all(sorted(order) == sorted([GPU, NIC, FPGA]) for order in orders)


async def test_allocate_error_fails_admission_and_leaves_nothing_allocated(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    await registered(kubelet, await plugin("gpu", GPU, healthy("g0", "g1")))
    nic = await registered(kubelet, await plugin("nic", NIC, healthy("n0")))
    nic.errors["Allocate"] = (grpc.StatusCode.INVALID_ARGUMENT, "unknown device n0")
    pod = Pod("p", [Container("gpu-only", {GPU: 1}), Container("both", {GPU: 1, NIC: 1})])

    with pytest.raises(AdmissionError) as failed:
        await kubelet.admit(pod)

    assert failed.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "unknown device n0" in failed.value.details
    assert (failed.value.pod, failed.value.container, failed.value.resource) == ("p", "both", NIC)
    assert kubelet.allocated() == {}
    assert kubelet.pod("p") is None


async def test_preferred_allocation_error_fails_admission(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    gpu = await registered(kubelet, await plugin("gpu", GPU, healthy("g0")))
    gpu.errors["GetPreferredAllocation"] = (grpc.StatusCode.FAILED_PRECONDITION, "busy")

    with pytest.raises(AdmissionError) as failed:
        await kubelet.admit(Pod("p", [Container("c", {GPU: 1})]))

    assert failed.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert gpu.called("Allocate") == []
    assert kubelet.allocated() == {}


async def test_too_few_free_healthy_devices_fails_admission_without_calls(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    gpu = await registered(kubelet, await plugin("gpu", GPU, {"g0": "Healthy", "g1": "Unhealthy"}))

    with pytest.raises(AdmissionError, match="Requested: 2, Available: 1"):
        await kubelet.admit(Pod("p", [Container("c", {GPU: 2})]))
    with pytest.raises(AdmissionError, match="Node didn't have enough resource"):
        await kubelet.admit(Pod("q", [Container("c", {NIC: 1})]))

    assert [name for name, _ in gpu.calls] == ["GetDevicePluginOptions"]


async def test_release_frees_devices_for_the_next_pod(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    await registered(kubelet, await plugin("gpu", GPU, healthy("g0", "g1")))
    await kubelet.admit(Pod("first", [Container("c", {GPU: 2})]))
    with pytest.raises(AdmissionError):
        await kubelet.admit(Pod("second", [Container("c", {GPU: 1})]))

    await kubelet.release("first")

    assert kubelet.allocated() == {}
    allocation = await kubelet.admit(Pod("second", [Container("c", {GPU: 1})]))
    assert len(allocation.devices("c", GPU)) == 1


async def test_app_container_reuses_init_container_devices_first(
    kubelet: Kubelet, plugin: PluginFactory
) -> None:
    gpu = await registered(kubelet, await plugin("gpu", GPU, healthy("g0", "g1", "g2")))
    pod = Pod(
        "p",
        containers=[Container("app", {GPU: 2})],
        init_containers=[Container("init", {GPU: 1})],
    )

    allocation = await kubelet.admit(pod)

    (init_device,) = allocation.devices("init", GPU)
    assert init_device in allocation.devices("app", GPU)
    request = gpu.called("GetPreferredAllocation")[-1].container_requests[0]
    assert list(request.must_include_deviceIDs) == [init_device]
    assert init_device in request.available_deviceIDs
    assert kubelet.allocated() == {GPU: set(allocation.devices("app", GPU))}


# Faithful options and waiting


async def test_checkpoint_on_updates_renames_for_every_list_and_watch_message(
    tmp_path: Path, plugin: PluginFactory
) -> None:
    kubelet = Kubelet(tmp_path, checkpoint_on_updates=True)
    await kubelet.start()
    try:
        fake = await registered(kubelet, await plugin("gpu", GPU, healthy("g0")))
        assert kubelet.checkpoint_writes == 1

        fake.set_devices(healthy("g0", "g1"))
        await kubelet.wait_until(lambda k: k.checkpoint_writes == 2, WAIT)

        registered_devices = read_checkpoint(kubelet.checkpoint_path)["Data"]["RegisteredDevices"]
        assert registered_devices == {GPU: ["g0", "g1"]}
    finally:
        await kubelet.stop()


async def test_stale_stream_bug_lets_old_stream_end_take_new_endpoint_down(
    tmp_path: Path, plugin: PluginFactory
) -> None:
    kubelet = Kubelet(tmp_path, stale_stream_bug=True)
    await kubelet.start()
    try:
        old = await registered(kubelet, await plugin("old", GPU, healthy("g0")))
        new = await registered(kubelet, await plugin("new", GPU, healthy("g0")))
        assert old.streams_closed == 0  # not closed on re-registration

        await old.stop()

        await kubelet.wait_until(lambda k: k.allocatable() == {GPU: 0}, WAIT)
        await async_wait_until(lambda: new.streams_closed == 1, WAIT, "new stream cancelled")
    finally:
        await kubelet.stop()


async def test_wait_until_times_out_naming_the_state(kubelet: Kubelet) -> None:
    def never(k: Kubelet) -> bool:
        return False

    with pytest.raises(TimeoutError, match=r"never still false after 0.05s.*running=True"):
        await kubelet.wait_until(never, 0.05)


async def test_command_line_serves_until_sigterm(tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as crashed:
        crashed.bind(str(stale))  # a socket file left behind, as by a crashed plugin
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "agents.standin.kubelet",
        "--device-plugin-dir",
        str(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    kubelet_socket = tmp_path / "kubelet.sock"
    try:
        await async_wait_until(kubelet_socket.exists, 20.0, "kubelet.sock")
        assert not stale.exists()
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = await process.communicate()

    assert process.returncode == 0, output.decode()
    assert b"socket_removed" in output
    assert os.listdir(tmp_path) == []


# Pod-resources


async def test_pod_resources_lists_the_pod_under_admission_and_ended_pods_until_deleted(
    tmp_path: Path, plugin: PluginFactory
) -> None:
    kubelet = Kubelet(tmp_path, seed=3, pod_resources_socket=tmp_path / "pr.sock")
    await kubelet.start()
    client = PodResources(tmp_path / "pr.sock")
    try:
        gpu = await registered(kubelet, await plugin("gpu", GPU, healthy("g0", "g1", "g2")))
        nic = await registered(kubelet, await plugin("nic", NIC, healthy("n0", "n1")))
        seen: list[dict[tuple[str, str], dict[str, list[str]]]] = []

        def listing_then_first(available: list[str], must: list[str], size: int) -> list[str]:
            assert kubelet.pod_resources is not None
            seen.append(listing_of(kubelet.pod_resources.answer()))
            return _first_sorted(available, must, size)

        gpu.preferred = nic.preferred = listing_then_first
        a = await kubelet.admit(Pod("a", [Container("main", {GPU: 2, NIC: 1})]))
        first, second = a.containers["main"].order
        # While its second resource was chosen, the pod was listed with its first so far.
        assert seen[0] == {("default/a", "main"): {}}
        assert seen[1] == {("default/a", "main"): {first: sorted(a.devices("main", first))}}
        assert await client.list() == {
            ("default/a", "main"): {r: sorted(a.devices("main", r)) for r in (first, second)}
        }

        await kubelet.end("a")  # ended, not deleted: its devices are free, still listed
        assert kubelet.allocated() == {}
        assert ("default/a", "main") in (await client.list() or {})
        await kubelet.release("a")  # deleted: gone at once
        assert await client.list() == {}
    finally:
        await client.close()
        await kubelet.stop()


async def test_pod_resources_client_without_a_socket_answers_none_and_warns_once(
    tmp_path: Path,
) -> None:
    client = PodResources(tmp_path / "absent.sock", timeout=1.0)
    with structlog.testing.capture_logs() as logs:
        assert await client.list() is None
        assert await client.list() is None
    await client.close()
    assert [e["event"] for e in logs] == ["pod_resources_unavailable"]
