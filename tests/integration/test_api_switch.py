"""A node moved from DRA mode back to device plugins: a real `node-agent run` process keeps
the devices that claims of the DRA checkpoints hold out of its lists until those claims
are unprepared, by the kubelet through the drivers it serves for that meanwhile (and
prepare refuses), or by itself once the kubelet's pod-resources answer no longer names
them; then the devices are advertised again and the drivers' sockets go."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from agents.api import podresources_pb2 as pr
from agents.api import podresources_pb2_grpc as pr_grpc
from agents.core.device import DeviceNode
from agents.dra.cdi import CdiDevice, CdiSpecs
from agents.dra.claim_checkpoint import ClaimCheckpoint, PreparedClaim, PreparedDevice
from agents.standin.kubelet import Kubelet
from tests.conditions import PROCESS_WAIT as WAIT
from tests.conditions import async_wait_until
from tests.integration.conftest import AgentProcess
from tests.standin.dra_kubelet import DraKubelet, PluginWatcher

GPU, NIC = "nvidia.com/gpu", "rdma/roce"
DRIVERS = ("gpu.nvidia.com", "roce.node-agents.io")


class _Lister(pr_grpc.PodResourcesListerServicer):  # type: ignore[misc]
    """The kubelet's pod-resources List, with the DRA claims its containers hold (or no
    answer, while `failing`); `calls` counts the agent's questions."""

    def __init__(self) -> None:
        self.claims: list[tuple[str, str]] = []
        self.failing = False
        self.calls = 0

    async def List(self, request: Any, context: Any) -> Any:
        self.calls += 1
        if self.failing:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the kubelet is restarting")
        return pr.ListPodResourcesResponse(
            pod_resources=[
                pr.PodResources(
                    name=f"pod-{name}",
                    namespace=namespace,
                    containers=[
                        pr.ContainerResources(
                            name="main",
                            dynamic_resources=[
                                pr.DynamicResource(claim_name=name, claim_namespace=namespace)
                            ],
                        )
                    ],
                )
                for namespace, name in self.claims
            ]
        )


@pytest.fixture
async def lister(tmp_path: Path) -> AsyncIterator[tuple[_Lister, Path]]:
    servicer, socket = _Lister(), tmp_path / "pod-resources.sock"
    server = grpc.aio.server()
    pr_grpc.add_PodResourcesListerServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    yield servicer, socket
    await server.stop(0)


def held_claim(root: Path, gpu: str, nic: str) -> None:
    """What DRA mode left: claim ns/c1 (UID u1) holding a GPU and a NIC, with CDI specs."""
    node = (DeviceNode("/dev/null", "/dev/null"),)
    held = {
        "gpu.nvidia.com": PreparedDevice("gpu-1", ("gpu",), "n", (), node, False, GPU, gpu),
        "roce.node-agents.io": PreparedDevice("nic-x", ("nic",), "n", (), node, False, NIC, nic),
    }
    for driver, device in held.items():
        claim = PreparedClaim("ns", "c1", (device,), {"X": "1"})
        ClaimCheckpoint(root / "plugins" / driver / "checkpoint.json").save({"u1": claim})
        CdiSpecs(root / "cdi").write(driver, "u1", [CdiDevice(device.device, node)], claim.env)


async def _asked(servicer: _Lister, times: int) -> None:
    """Until the agent asked pod-resources `times` times: it has acted on every answer
    before the last (it asks again only once it has)."""
    await async_wait_until(lambda: servicer.calls >= times, WAIT, f"{times} questions")


def _checkpoint(root: Path, driver: str) -> ClaimCheckpoint:
    return ClaimCheckpoint(root / "plugins" / driver / "checkpoint.json")


def listed(kubelet: Kubelet, resource: str) -> set[str]:
    view = kubelet.resource(resource)
    return set(view.devices) if view is not None else set()


@pytest.fixture
def held(tmp_path: Path, node_doc: dict[str, Any]) -> tuple[str, str]:
    """The GPU and NIC that claim ns/c1 holds."""
    gpu, nic = node_doc["gpus"][1]["uuid"], node_doc["nics"][2]["pci"]
    held_claim(tmp_path, gpu, nic)
    return gpu, nic


@pytest.fixture
def args(tmp_path: Path, node_file: Path, plugin_dir: Path) -> list[str]:
    return [
        *("run", "--simulate", str(node_file), "--device-plugin-dir", str(plugin_dir)),
        *("--kubelet-plugins-dir", str(tmp_path / "plugins"), "--cdi-root", str(tmp_path / "cdi")),
        *("--kubelet-registry-dir", str(tmp_path / "registry")),
    ]


async def test_devices_of_dra_claims_come_back_when_the_claims_end(
    tmp_path: Path,
    held: tuple[str, str],
    *,
    args: list[str],
    kubelet: Kubelet,
    lister: tuple[_Lister, Path],
    start_agent: Callable[..., AgentProcess],
) -> None:
    servicer, socket = lister
    gpu, nic = held
    servicer.claims.append(("ns", "c1"))  # its pod still runs
    start_agent([*args, "--pod-resources-socket", str(socket)], short_timing=True)
    await kubelet.wait_until(lambda k: k.allocatable() == {GPU: 7, NIC: 7}, WAIT)
    assert gpu not in listed(kubelet, GPU)
    assert nic not in listed(kubelet, NIC)
    await _asked(servicer, 3)  # answers that name the claim free nothing
    assert kubelet.allocatable() == {GPU: 7, NIC: 7}
    assert list(_checkpoint(tmp_path, "gpu.nvidia.com").load()) == ["u1"]

    servicer.claims.clear()  # the pod ended
    await kubelet.wait_until(lambda k: k.allocatable() == {GPU: 8, NIC: 8}, WAIT)
    for driver in ("gpu.nvidia.com", "roce.node-agents.io"):
        assert ClaimCheckpoint(tmp_path / "plugins" / driver / "checkpoint.json").load() == {}
        assert CdiSpecs(tmp_path / "cdi").written(driver) == []


async def test_without_pod_resources_the_devices_stay_out(
    tmp_path: Path,
    held: tuple[str, str],
    *,
    args: list[str],
    kubelet: Kubelet,
    lister: tuple[_Lister, Path],
    start_agent: Callable[..., AgentProcess],
) -> None:
    """No answer is no news: the claim outlives more unanswered questions in a row than
    would free it were they answers that do not name it."""
    servicer, socket = lister
    servicer.failing = True
    agent = start_agent([*args, "--pod-resources-socket", str(socket)], short_timing=True)
    await kubelet.wait_until(lambda k: k.allocatable() == {GPU: 7, NIC: 7}, WAIT)
    assert held[0] not in listed(kubelet, GPU)
    await _asked(servicer, 3)  # the second unanswered one has been acted on
    assert "pod_resources_unavailable" in agent.stderr
    assert kubelet.allocatable() == {GPU: 7, NIC: 7}
    assert list(_checkpoint(tmp_path, "gpu.nvidia.com").load()) == ["u1"]


async def test_the_kubelet_unprepares_through_the_drivers_served_meanwhile(
    tmp_path: Path,
    held: tuple[str, str],
    args: list[str],
    kubelet: Kubelet,
    start_agent: Callable[[Sequence[str]], AgentProcess],
) -> None:
    watcher = PluginWatcher(tmp_path / "registry")
    await watcher.start()
    dra = DraKubelet(watcher)
    try:
        start_agent([*args, "--pod-resources-socket", str(tmp_path / "none.sock")])
        await kubelet.wait_until(lambda k: k.allocatable() == {GPU: 7, NIC: 7}, WAIT)
        for driver in DRIVERS:
            await watcher.registered(driver, WAIT)
        answer = await dra.prepare("gpu.nvidia.com", [("ns", "u2", "c2")])
        assert "device plugins" in answer.claims["u2"].error
        again = await dra.prepare("gpu.nvidia.com", [("ns", "u1", "c1")])  # a kubelet retry
        assert again.claims["u1"].error == ""
        for driver in DRIVERS:  # the pod ends: the kubelet unprepares its claim
            done = await dra.unprepare(driver, [("ns", "u1", "c1")])
            assert done.claims["u1"].error == ""
        await kubelet.wait_until(lambda k: k.allocatable() == {GPU: 8, NIC: 8}, WAIT)
        for driver in DRIVERS:
            await watcher.gone(driver, WAIT)
            assert CdiSpecs(tmp_path / "cdi").written(driver) == []
    finally:
        await dra.close()
        await watcher.stop()
