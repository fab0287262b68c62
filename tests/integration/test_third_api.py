"""A third kubelet API, defined in the tests (tests/third/api.py), given to `node-agent`
beside agents/apis.py's (`main(apis=...)`, tests/third/agent.py) and chosen with `--api`
as the others are: nothing under agents/ names it, yet the GPU and RoCE families of a
simulated node reach it over its unix socket with their devices, their edits and their
health, an XID turning a GPU Unhealthy with its typed cause."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.conditions import PROCESS_WAIT, async_wait_until
from tests.integration.conftest import AgentProcess
from tests.third.api import EDITS, WATCH, Doc, decode, encode

AGENT = ("-m", "tests.third.agent")


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A directory for sockets: pytest's tmp_path is too long for a unix socket's path."""
    with tempfile.TemporaryDirectory(prefix="listing-") as name:
        yield Path(name)


@pytest.fixture
def listing_agent(
    node_file: Path, short_dir: Path, tmp_path: Path
) -> Iterator[Callable[..., AgentProcess]]:
    """listing_agent(*more): `node-agent run --api listing` on the simulated node."""
    spawned: list[AgentProcess] = []

    def start(*more: str) -> AgentProcess:
        kubelet = tmp_path / "kubelet"
        args = [
            *("run", "--api", "listing", "--simulate", str(node_file)),
            *("--device-plugin-dir", str(short_dir / "dp")),
            *("--pod-resources-socket", str(short_dir / "pod-resources.sock")),
            *("--kubelet-plugins-dir", str(kubelet / "plugins")),
            *("--kubelet-registry-dir", str(kubelet / "registry")),
            *("--cdi-root", str(kubelet / "cdi")),
            *more,
        ]
        stderr_path = tmp_path / f"agent-{len(spawned)}.stderr"
        with stderr_path.open("wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, *AGENT, *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )
        spawned.append(AgentProcess(process, 0.0, stderr_path))
        return spawned[-1]

    yield start
    for agent in spawned:
        if agent.alive():
            agent.process.kill()
        agent.process.wait(10)


@pytest.fixture
async def channel(short_dir: Path) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"unix://{short_dir / 'listing.sock'}") as channel:
        yield channel


def devices_of(listing: Doc, family: str) -> dict[str, Doc]:
    found = next(f for f in listing["families"] if f["name"] == family)
    return {d["id"]: d for d in found["devices"]}


async def test_the_families_devices_edits_and_health_reach_a_third_api(
    listing_agent: Callable[..., AgentProcess],
    short_dir: Path,
    channel: grpc.aio.Channel,
    node_doc: dict[str, Any],
    edit_node: Callable[..., None],
) -> None:
    socket = short_dir / "listing.sock"
    agent = listing_agent("--listing-socket", str(socket))
    await async_wait_until(lambda: socket.exists() or not agent.alive(), PROCESS_WAIT, "socket")
    assert agent.alive(), agent.stderr[-3000:]
    assert socket.stat().st_mode & 0o777 == 0o600  # made by the kernel's socket server

    watch = channel.unary_stream(WATCH, request_serializer=encode, response_deserializer=decode)
    stream = watch({}, wait_for_ready=True, timeout=PROCESS_WAIT)
    first = await stream.read()
    assert isinstance(first, dict)
    uuids = [g["uuid"] for g in node_doc["gpus"]]
    gpus = devices_of(first, "gpu")
    assert sorted(gpus) == sorted(uuids)
    assert {d["grade"] for d in gpus.values()} == {"Healthy"}
    assert len(devices_of(first, "roce")) == len(node_doc["nics"])

    edits = channel.unary_unary(EDITS, request_serializer=encode, response_deserializer=decode)
    got = await edits({"devices": [["nvidia.com/gpu", uuids[0]]]}, timeout=PROCESS_WAIT)
    assert got["env"]["NVIDIA_VISIBLE_DEVICES"] == uuids[0]  # the runtime's env strategy
    nic = sorted(devices_of(first, "roce"))[0]
    got = await edits({"devices": [["rdma/roce", nic]]}, timeout=PROCESS_WAIT)
    assert got["env"]["RDMA_NETDEVS"] in {n["netdev"] for n in node_doc["nics"]}
    paths = {node[0] for node in got["nodes"][f"rdma/roce/{nic}"]}
    assert "/dev/infiniband/rdma_cm" in paths
    assert any(p.startswith("/dev/infiniband/uverbs") for p in paths)

    edit_node(lambda d: d["gpus"][0]["xids"].append(79))
    while True:
        listing = await stream.read()
        assert isinstance(listing, dict), f"the stream ended: {agent.stderr[-3000:]}"
        gpu0 = devices_of(listing, "gpu")[uuids[0]]
        if gpu0["grade"] != "Healthy":
            break
    assert gpu0["healthy"] is False
    assert (gpu0["grade"], gpu0["cause"]) == ("Unhealthy", "xid=79")
    assert gpu0["text"] == "XID 79 (fell off the bus)"
    assert {d["grade"] for i, d in devices_of(listing, "gpu").items() if i != uuids[0]} == {
        "Healthy"
    }
    stream.cancel()
    assert agent.terminate() == 0, agent.stderr[-3000:]
    assert not socket.exists()


def test_the_third_api_says_what_its_command_line_lacks(
    listing_agent: Callable[..., AgentProcess],
) -> None:
    agent = listing_agent()
    assert agent.process.wait(PROCESS_WAIT) == 2, agent.stderr[-3000:]
    assert "--listing-socket" in agent.stderr
