"""Hostile DevicePlugin requests against a live agent over its unix sockets: only OK,
INVALID_ARGUMENT or FAILED_PRECONDITION come back, every OK answer keeps the contract,
no call hangs, and the agent answers normally afterwards."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from agents.api import api_pb2 as pb
from agents.config import parse_config
from agents.sim.bundled import bundled_node
from hack.benchlib.agent import Client
from hack.benchlib.nodes import generate_node, sharing_config, write_yaml
from tests.fuzz.fuzzing import FUZZ
from tests.fuzz.live import LiveAgent

pytestmark = pytest.mark.fuzz

DEADLINE_S = 5.0  # per call: a hang fails the test instead of stalling it
ALLOWED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}
TARGETS = [
    ("whole", "nvidia.com/gpu"),
    ("whole", "rdma/roce"),
    ("shared", "nvidia.com/gpu"),
    ("shared", "nvidia.com/mig-1g.10gb"),
    ("shared", "rdma/roce"),
]


@dataclass
class Target:
    client: Client
    ids: list[str]
    netdevs: dict[str, str]  # NIC PCI address -> interface name
    mig: bool

    def visible(self, ids: list[str]) -> set[str]:
        """What NVIDIA_VISIBLE_DEVICES must list for these device IDs."""
        return {i.split("::")[0] for i in ids}


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, LiveAgent]]:
    root = tmp_path_factory.mktemp("fuzz")
    whole_node = root / "whole.yaml"
    shutil.copy(bundled_node("h100-8gpu-8nic"), whole_node)
    shared_node = write_yaml(root / "shared.yaml", generate_node(4, 4, mig_gpus=1))
    shared_config = parse_config(yaml.safe_dump(sharing_config(4, mig_strategy="mixed")), "fuzz")
    live = {
        "whole": LiveAgent(whole_node, _short_dir("whole"), parse_config("version: v1\n", "fuzz")),
        "shared": LiveAgent(shared_node, _short_dir("shared"), shared_config),
    }
    try:
        for agent in live.values():
            agent.start()
        yield live
    finally:
        for agent in live.values():
            agent.stop()
            shutil.rmtree(agent.plugin_dir, ignore_errors=True)


def _short_dir(name: str) -> Path:
    import tempfile

    return Path(tempfile.mkdtemp(prefix=f"fz-{name}-"))


@pytest.fixture(scope="module", params=TARGETS, ids=lambda t: f"{t[0]}:{t[1]}")
def target(request: pytest.FixtureRequest, agents: dict[str, LiveAgent]) -> Iterator[Target]:
    kind, resource = request.param
    agent = agents[kind]
    doc = yaml.safe_load(agent.node_file.read_text())
    netdevs = {n["pci"]: n["netdev"] for n in doc["nics"]}
    with Client(agent.socket(resource)) as client:
        yield Target(client, sorted(client.devices()), netdevs, "mig" in resource)


def device_ids(known: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(known),
        st.sampled_from(known).map(lambda i: i + "::9999"),
        st.text(max_size=40),
        st.just(""),
        st.sampled_from(["GPU-", "MIG-", "0000:00:00.0", "::", "..", "\x00"]),
    )


def call(rpc: Any, request: Any) -> Any | None:
    """The answer, or None for an allowed refusal; anything else fails."""
    try:
        return rpc(request, timeout=DEADLINE_S)
    except grpc.RpcError as err:
        code = err.code()
        assert code in ALLOWED, f"{code}: {err.details()}"
        assert err.details(), "a refusal names what is wrong"
        return None


def check_allocate(target: Target, asked: list[list[str]], answer: Any) -> None:
    assert len(answer.container_responses) == len(asked)
    for ids, response in zip(asked, answer.container_responses, strict=True):
        assert set(ids) <= set(target.ids)
        envs = dict(response.envs)
        if "NVIDIA_VISIBLE_DEVICES" in envs:
            assert set(envs["NVIDIA_VISIBLE_DEVICES"].split(",")) == target.visible(ids)
        else:
            assert set(envs["RDMA_NETDEVS"].split(",")) == {target.netdevs[i] for i in ids}


def check_preferred(requests: list[Any], answer: Any) -> None:
    assert len(answer.container_responses) == len(requests)
    for req, response in zip(requests, answer.container_responses, strict=True):
        got = list(response.deviceIDs)
        assert len(got) == req.allocation_size
        assert len(set(got)) == len(got)
        assert set(got) <= set(req.available_deviceIDs)
        assert set(req.must_include_deviceIDs) <= set(got)


def still_answers(target: Target) -> None:
    target.client.options(timeout=DEADLINE_S)
    answer = target.client.allocate(target.ids[:1], timeout=DEADLINE_S)
    assert len(answer.container_responses) == 1


@FUZZ
@given(data=st.data())
def test_allocate_answers_only_ok_or_a_named_refusal(target: Target, data: st.DataObject) -> None:
    ids = device_ids(target.ids)
    asked = data.draw(st.lists(st.lists(ids, max_size=12), max_size=4), label="containers")
    request = pb.AllocateRequest(
        container_requests=[pb.ContainerAllocateRequest(devicesIDs=c) for c in asked]
    )
    answer = call(target.client.stub.Allocate, request)
    if answer is not None:
        check_allocate(target, asked, answer)
    still_answers(target)


@FUZZ
@given(data=st.data())
def test_preferred_allocation_answers_only_ok_or_a_named_refusal(
    target: Target, data: st.DataObject
) -> None:
    ids = device_ids(target.ids)
    sizes = st.one_of(st.integers(-3, len(target.ids) + 3), st.integers(-(2**31), 2**31 - 1))
    requests = []
    for _ in range(data.draw(st.integers(0, 3), label="containers")):
        available = data.draw(
            st.one_of(
                st.lists(ids, max_size=20),
                st.permutations(target.ids),
                st.lists(st.sampled_from(target.ids), unique=True),
            ),
            label="available",
        )
        must = data.draw(
            st.one_of(
                st.lists(ids, max_size=4),
                st.lists(st.sampled_from(available or [""]), max_size=3, unique=True),
            ),
            label="must_include",
        )
        size = data.draw(
            st.one_of(sizes, st.integers(len(set(must)), max(len(available), len(set(must))))),
            label="size",
        )
        requests.append(
            pb.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        )
    answer = call(
        target.client.stub.GetPreferredAllocation,
        pb.PreferredAllocationRequest(container_requests=requests),
    )
    if answer is not None:
        check_preferred(requests, answer)
    still_answers(target)


@pytest.mark.parametrize("shape", ["unknown", "repeated", "known-cycled"])
def test_ten_thousand_ids_are_refused_or_answered_quickly(target: Target, shape: str) -> None:
    huge = {
        "unknown": [f"nope-{i}" for i in range(10_000)],
        "repeated": [target.ids[0]] * 10_000,
        "known-cycled": [target.ids[i % len(target.ids)] + f"::{i}" for i in range(10_000)],
    }[shape]
    call(
        target.client.stub.Allocate,
        pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devicesIDs=huge)]),
    )
    request = pb.ContainerPreferredAllocationRequest(
        available_deviceIDs=huge, must_include_deviceIDs=huge[:5000], allocation_size=10_000
    )
    call(
        target.client.stub.GetPreferredAllocation,
        pb.PreferredAllocationRequest(container_requests=[request]),
    )
    still_answers(target)


def test_many_container_requests_get_one_answer_each(target: Target) -> None:
    asked = [[target.ids[i % len(target.ids)]] for i in range(2000)]
    answer = call(
        target.client.stub.Allocate,
        pb.AllocateRequest(
            container_requests=[pb.ContainerAllocateRequest(devicesIDs=c) for c in asked]
        ),
    )
    assert answer is not None
    check_allocate(target, asked, answer)
    requests = [
        pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=target.ids, must_include_deviceIDs=[], allocation_size=1
        )
        for _ in range(500)
    ]
    answer = call(
        target.client.stub.GetPreferredAllocation,
        pb.PreferredAllocationRequest(container_requests=requests),
    )
    assert answer is not None
    check_preferred(requests, answer)
