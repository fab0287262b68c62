"""Time-sliced GPUs on the bundled 8-GPU node, through the kubelet stand-in: a config in
the established v1 format, replica IDs and names, admission, Allocate and the spread."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import grpc
import pytest

from agents.config import TimeSlicedResource
from agents.gpu.allocation import VISIBLE_DEVICES
from agents.gpu.plan import GPU_RESOURCE
from agents.standin.endpoint import PluginEndpoint, PluginError
from agents.standin.kubelet import AdmissionError, Container, Pod
from tests.conditions import WAIT
from tests.integration.gpu_agent import Running, config, running_agent

# A ConfigMap as operators already write it for the established v1 format, unchanged.
V1_TIME_SLICING = """\
version: v1
flags:
  migStrategy: mixed
  failOnInitError: true
  nvidiaDriverRoot: /
  plugin:
    passDeviceSpecs: false
    deviceListStrategy: envvar
    deviceIDStrategy: uuid
sharing:
  timeSlicing:
    resources:
      - name: nvidia.com/gpu
        replicas: 4
"""
REPLICAS = 4
GPUS = 8


def time_slicing(*, extra: str = "", entry: str = "") -> str:
    return f"""\
version: v1
sharing:
  timeSlicing:
{extra}    resources:
      - name: nvidia.com/gpu
        replicas: {REPLICAS}
{entry}"""


def gpu_of(replica: str) -> str:
    gpu, sep, n = replica.rpartition("::")
    assert sep and n.isdigit(), replica
    return gpu


def endpoint(run: Running, resource: str = GPU_RESOURCE) -> PluginEndpoint:
    found = run.kubelet.endpoint(resource)
    assert found is not None, run.kubelet.summary()
    return found


def test_v1_time_slicing_config_is_accepted_unchanged() -> None:
    parsed = config(V1_TIME_SLICING)
    assert parsed.flags.mig_strategy == "mixed"
    assert parsed.sharing.time_slicing.resources == (TimeSlicedResource("nvidia.com/gpu", 4),)
    assert parsed.sharing.time_slicing.advertised_name(GPU_RESOURCE) == GPU_RESOURCE


async def test_four_replicas_of_eight_gpus_are_32_devices_named_uuid_n(tmp_path: Path) -> None:
    async with running_agent(tmp_path, V1_TIME_SLICING) as run:
        await run.registered({GPU_RESOURCE: GPUS * REPLICAS})
        expected = {f"{uuid}::{n}" for uuid in run.gpu_uuids() for n in range(REPLICAS)}
        assert set(run.devices()) == expected
        assert set(run.devices().values()) == {"Healthy"}
        view = run.kubelet.resource(GPU_RESOURCE)
        assert view is not None
        numa = {g.uuid: g.numa for g in run.sim.spec.gpus}
        for device_id, state in view.devices.items():
            assert state.numa == (numa[gpu_of(device_id)],), device_id


@pytest.mark.parametrize(
    ("extra", "entry", "name"),
    [
        ("    renameByDefault: true\n", "", "nvidia.com/gpu.shared"),
        ("", "        rename: nvidia.com/gpu-timesliced\n", "nvidia.com/gpu-timesliced"),
        ("    renameByDefault: true\n", "        rename: gpu-ts\n", "nvidia.com/gpu-ts"),
    ],
    ids=["renameByDefault", "rename", "rename-beats-renameByDefault"],
)
async def test_renamed_replicas_replace_the_gpu_resource(
    tmp_path: Path, extra: str, entry: str, name: str
) -> None:
    async with running_agent(tmp_path, time_slicing(extra=extra, entry=entry)) as run:
        await run.registered({name: GPUS * REPLICAS})
        assert all("::" in device_id for device_id in run.devices(name))


async def test_two_replicas_admitted_land_on_two_gpus_each_named_once(tmp_path: Path) -> None:
    async with running_agent(tmp_path, V1_TIME_SLICING) as run:
        await run.registered({GPU_RESOURCE: GPUS * REPLICAS})
        got = await run.kubelet.admit(Pod("pair", [Container("c", {GPU_RESOURCE: 2})]))
        ids = got.devices("c", GPU_RESOURCE)
        gpus = {gpu_of(i) for i in ids}
        assert len(ids) == 2
        assert len(gpus) == 2
        env = got.containers["c"].responses[GPU_RESOURCE].envs[VISIBLE_DEVICES]
        assert sorted(env.split(",")) == sorted(gpus)


async def test_replicas_of_one_gpu_appear_once_in_visible_devices(tmp_path: Path) -> None:
    async with running_agent(tmp_path, V1_TIME_SLICING) as run:
        await run.registered({GPU_RESOURCE: GPUS * REPLICAS})
        a, b = run.gpu_uuids()[:2]
        response = await endpoint(run).allocate([f"{a}::0", f"{a}::2", f"{b}::3", f"{a}::1"])
        assert response.envs[VISIBLE_DEVICES] == f"{a},{b}"


async def test_fail_requests_greater_than_one_refuses_two_replicas(tmp_path: Path) -> None:
    cfg = time_slicing(extra="    failRequestsGreaterThanOne: true\n")
    async with running_agent(tmp_path, cfg) as run:
        await run.registered({GPU_RESOURCE: GPUS * REPLICAS})
        a, b = run.gpu_uuids()[:2]
        with pytest.raises(PluginError) as direct:
            await endpoint(run).allocate([f"{a}::0", f"{b}::1"])
        assert direct.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert f"{a}::0" in direct.value.details
        assert f"{b}::1" in direct.value.details

        with pytest.raises(AdmissionError) as admitted:
            await run.kubelet.admit(Pod("two", [Container("c", {GPU_RESOURCE: 2})]))
        assert admitted.value.code == grpc.StatusCode.INVALID_ARGUMENT
        named = set(re.findall(r"GPU-[0-9a-f-]+::\d+", admitted.value.details))
        assert len(named) == 2, admitted.value.details
        assert run.kubelet.allocated() == {}  # nothing stays held after a refusal

        one = await run.kubelet.admit(Pod("one", [Container("c", {GPU_RESOURCE: 1})]))
        assert len(one.devices("c", GPU_RESOURCE)) == 1


async def test_preferred_allocation_spreads_over_gpus_with_fewest_replicas_in_use(
    tmp_path: Path,
) -> None:
    async with running_agent(tmp_path, V1_TIME_SLICING) as run:
        await run.registered({GPU_RESOURCE: GPUS * REPLICAS})
        uuids = run.gpu_uuids()
        # In use = not offered as available: GPU7 none, GPU0..5 one each, GPU6 two.
        in_use = {u: 1 for u in uuids[:6]} | {uuids[6]: 2, uuids[7]: 0}
        available = [f"{u}::{n}" for u in uuids for n in range(in_use[u], REPLICAS)]
        answer = await endpoint(run).preferred(available, [], 3)
        assert len(answer) == 3
        assert len({gpu_of(r) for r in answer}) == 3, answer
        assert gpu_of(answer[0]) == uuids[7]
        assert all(in_use[gpu_of(r)] <= 1 for r in answer), answer

        # A must-include replica stays, and the others avoid its GPU.
        must = f"{uuids[6]}::3"
        answer = await endpoint(run).preferred(available, [must], 2)
        assert must in answer
        assert [gpu_of(r) for r in answer if r != must] == [uuids[7]]


async def test_single_replica_pods_take_one_replica_of_each_gpu_before_doubling_up(
    tmp_path: Path,
) -> None:
    async with running_agent(tmp_path, V1_TIME_SLICING) as run:
        await run.registered({GPU_RESOURCE: GPUS * REPLICAS})
        load: Counter[str] = Counter()
        for n in range(2 * GPUS):
            got = await run.kubelet.admit(Pod(f"p{n}", [Container("c", {GPU_RESOURCE: 1})]))
            load.update(gpu_of(i) for i in got.devices("c", GPU_RESOURCE))
            assert max(load.values()) - min(load[u] for u in run.gpu_uuids()) <= 1, load
        assert load == Counter({u: 2 for u in run.gpu_uuids()})


async def test_an_xid_turns_every_replica_of_its_gpu_unhealthy(tmp_path: Path) -> None:
    async with running_agent(tmp_path, V1_TIME_SLICING) as run:
        await run.registered({GPU_RESOURCE: GPUS * REPLICAS})
        victim = run.gpu_uuids()[2]
        await run.edit_node(lambda d: d["gpus"][2]["xids"].append(48))

        def victim_down(_: object) -> bool:
            return {i for i, h in run.devices().items() if h == "Unhealthy"} == {
                f"{victim}::{n}" for n in range(REPLICAS)
            }

        await run.kubelet.wait_until(victim_down, WAIT)
        assert run.kubelet.allocatable() == {GPU_RESOURCE: (GPUS - 1) * REPLICAS}
