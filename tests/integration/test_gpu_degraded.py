"""Degraded GPUs on a simulated node (docs/degraded.md), through the kubelet stand-in over
real gRPC: each GPU signal both ways (Degraded within a few probe periods, chosen last by
GetPreferredAllocation while the kubelet still hears Healthy; Healthy again after holdS),
an Unhealthy signal, `report: unhealthy`, and new limits on reload."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agents.config import parse_config
from agents.core.health import Grade
from agents.gpu.family import GpuFamily
from agents.gpu.plan import GPU_RESOURCE
from tests.conditions import WAIT, async_wait_until
from tests.integration.gpu_agent import Running, running_agent
from tests.timing import SHORT

HOLD_S = 1  # health.degraded.holdS of these tests
CONFIG = f"version: v1\nhealth:\n  degraded:\n    holdS: {HOLD_S}\n"
GPU_INDEX = 2  # the GPU the signals are injected on
POLL_S = 0.02  # between two preferred-allocation requests

Edit = Callable[[dict[str, Any]], object]


def _set(**fields: object) -> Edit:
    return lambda gpu: gpu.update(fields)


# signal -> (the edit that puts it out of limits, the edit that brings it back)
SIGNALS: dict[str, tuple[Edit, Edit]] = {
    "pcie-width": (_set(pcie={"width": 8, "maxWidth": 16}), _set(pcie=None)),
    "pcie-gen": (_set(pcie={"gen": 4, "maxGen": 5}, utilization=90), _set(utilization=0)),
    # A counter that grows past 30.72 per minute (Gen5 x16); a reset starts it afresh.
    "pcie-replays": (_set(pcie={"replays": 500}), _set(pcie={"replays": 0})),
    "nvlink-down": (_set(nvlinksDown=2), _set(nvlinksDown=0)),
    "hw-slowdown": (_set(clockEvents=["hwThermalSlowdown"]), _set(clockEvents=[])),
    "row-remap-pending": (_set(remappedRows={"pending": True}), _set(remappedRows=None)),
    "retired-pages-pending": (_set(retiredPagesPending=True), _set(retiredPagesPending=False)),
}


def _grade(run: Running, uuid: str) -> tuple[Grade, str]:
    """The GPU's grade and the label of its cause ("" while Healthy), as the family tells
    every consumer."""
    family = run.agent.family(GpuFamily)
    assert family is not None
    [health] = [h for h in family.device_health() if h.device_id == uuid]
    return health.grade, "" if health.cause is None else health.cause.label


async def _preferred(run: Running, size: int) -> set[str]:
    endpoint = run.kubelet.endpoint(GPU_RESOURCE)
    assert endpoint is not None
    return set(await endpoint.preferred(run.gpu_uuids(), [], size))


async def _until_preferred(run: Running, want: Callable[[set[str]], bool], within: float) -> None:
    """Ask GetPreferredAllocation (7 of the 8 GPUs) until its answer is as wanted."""
    deadline = time.monotonic() + within
    while not want(answer := await _preferred(run, 7)):
        assert time.monotonic() < deadline, f"preferred allocation still {sorted(answer)}"
        await asyncio.sleep(POLL_S)


def _edit_gpu(index: int, change: Edit) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        gpu = doc["gpus"][index]
        change(gpu)
        for key in [k for k, v in gpu.items() if v is None]:
            del gpu[key]

    return edit


@pytest.mark.parametrize("signal", list(SIGNALS))
async def test_each_gpu_signal_makes_it_degraded_and_chosen_last_then_healthy_after_the_hold(
    tmp_path: Path, signal: str
) -> None:
    bad, good = SIGNALS[signal]
    async with running_agent(tmp_path, CONFIG, timing=SHORT) as run:
        await run.registered({GPU_RESOURCE: 8})
        uuid = run.gpu_uuids()[GPU_INDEX]
        baseline = await _preferred(run, 7)
        assert uuid in baseline  # the choice leaves another GPU out on a healthy node

        await run.edit_node(_edit_gpu(GPU_INDEX, bad))
        await async_wait_until(lambda: _grade(run, uuid) == (Grade.DEGRADED, signal), WAIT)
        await _until_preferred(run, lambda chosen: uuid not in chosen, WAIT)
        assert run.devices()[uuid] == "Healthy"  # the kubelet keeps counting it
        assert uuid in await _preferred(run, 8)  # still given where nothing else is left

        await run.edit_node(_edit_gpu(GPU_INDEX, good))
        began = time.monotonic()
        await async_wait_until(lambda: _grade(run, uuid) == (Grade.HEALTHY, ""), WAIT + HOLD_S)
        assert time.monotonic() - began >= HOLD_S - SHORT.signal_probe_s * 2
        assert await _preferred(run, 7) == baseline
        assert all(h == "Healthy" for h in run.devices().values())


async def test_a_failed_row_remap_makes_the_gpu_unhealthy_to_the_kubelet(tmp_path: Path) -> None:
    async with running_agent(tmp_path, CONFIG, timing=SHORT) as run:
        await run.registered({GPU_RESOURCE: 8})
        uuid = run.gpu_uuids()[GPU_INDEX]
        await run.edit_node(_edit_gpu(GPU_INDEX, _set(remappedRows={"failed": True})))
        await run.kubelet.wait_until(lambda _k: run.devices()[uuid] == "Unhealthy", WAIT)
        assert _grade(run, uuid) == (Grade.UNHEALTHY, "row-remap-failed")
        await run.edit_node(_edit_gpu(GPU_INDEX, _set(remappedRows=None)))
        await run.kubelet.wait_until(lambda _k: run.devices()[uuid] == "Healthy", WAIT + HOLD_S)


async def test_an_xid_wins_over_a_degraded_signal(tmp_path: Path) -> None:
    async with running_agent(tmp_path, CONFIG, timing=SHORT) as run:
        await run.registered({GPU_RESOURCE: 8})
        uuid = run.gpu_uuids()[GPU_INDEX]
        await run.edit_node(_edit_gpu(GPU_INDEX, SIGNALS["pcie-width"][0]))
        await async_wait_until(lambda: _grade(run, uuid)[0] is Grade.DEGRADED, WAIT)
        await run.edit_node(lambda d: d["gpus"][GPU_INDEX]["xids"].append(79))
        await async_wait_until(lambda: _grade(run, uuid) == (Grade.UNHEALTHY, "xid=79"), WAIT)
        # ListAndWatch carries the change to the kubelet after the family has it.
        await run.kubelet.wait_until(lambda _: run.devices()[uuid] == "Unhealthy", WAIT)


async def test_report_unhealthy_tells_the_kubelet_a_degraded_gpu_is_unhealthy(
    tmp_path: Path,
) -> None:
    config = CONFIG + "    report: unhealthy\n"
    async with running_agent(tmp_path, config, timing=SHORT) as run:
        await run.registered({GPU_RESOURCE: 8})
        uuid = run.gpu_uuids()[GPU_INDEX]
        await run.edit_node(_edit_gpu(GPU_INDEX, SIGNALS["pcie-width"][0]))
        await run.kubelet.wait_until(lambda _k: run.devices()[uuid] == "Unhealthy", WAIT)
        assert _grade(run, uuid) == (Grade.DEGRADED, "pcie-width")
        await run.edit_node(_edit_gpu(GPU_INDEX, SIGNALS["pcie-width"][1]))
        await run.kubelet.wait_until(lambda _k: run.devices()[uuid] == "Healthy", WAIT + HOLD_S)


async def test_a_reload_applies_new_limits_to_a_degraded_gpu(tmp_path: Path) -> None:
    long_hold = "version: v1\nhealth:\n  degraded:\n    holdS: 3600\n"
    async with running_agent(tmp_path, long_hold, timing=SHORT) as run:
        await run.registered({GPU_RESOURCE: 8})
        uuid = run.gpu_uuids()[GPU_INDEX]
        await run.edit_node(_edit_gpu(GPU_INDEX, SIGNALS["pcie-width"][0]))
        await async_wait_until(lambda: _grade(run, uuid)[0] is Grade.DEGRADED, WAIT)
        await run.edit_node(_edit_gpu(GPU_INDEX, SIGNALS["pcie-width"][1]))
        # Within limits again, held for an hour: a reload to a short hold lets it go.
        await run.agent.reload(parse_config(CONFIG, "<reload>"))
        await async_wait_until(lambda: _grade(run, uuid)[0] is Grade.HEALTHY, WAIT + HOLD_S)


async def test_paired_gpus_take_a_degraded_gpu_last(tmp_path: Path) -> None:
    async with running_agent(tmp_path, CONFIG, timing=SHORT, families=("gpu", "roce")) as run:
        await run.registered({GPU_RESOURCE: 8, "rdma/roce": 8})
        uuid = run.gpu_uuids()[GPU_INDEX]
        assert uuid in await _preferred(run, 7)
        await run.edit_node(_edit_gpu(GPU_INDEX, SIGNALS["pcie-width"][0]))
        await _until_preferred(run, lambda chosen: uuid not in chosen, WAIT)


async def test_replicas_of_a_degraded_gpu_are_chosen_last(tmp_path: Path) -> None:
    shared = CONFIG + (
        "sharing:\n  timeSlicing:\n    resources:\n      - {name: nvidia.com/gpu, replicas: 2}\n"
    )
    async with running_agent(tmp_path, shared, timing=SHORT) as run:
        await run.registered({GPU_RESOURCE: 16})
        uuid = run.gpu_uuids()[GPU_INDEX]
        endpoint = run.kubelet.endpoint(GPU_RESOURCE)
        assert endpoint is not None
        replicas = sorted(run.devices())
        on_it = {r for r in replicas if r.startswith(uuid)}
        assert len(on_it) == 2
        await run.edit_node(_edit_gpu(GPU_INDEX, SIGNALS["pcie-width"][0]))
        await async_wait_until(lambda: _grade(run, uuid)[0] is Grade.DEGRADED, WAIT)
        for size in (1, 14):
            assert not on_it & set(await endpoint.preferred(replicas, [], size))
        assert len(on_it & set(await endpoint.preferred(replicas, [], 15))) == 1


async def test_a_gpu_that_answers_again_after_it_was_lost_is_judged_afresh(
    tmp_path: Path,
) -> None:
    async with running_agent(tmp_path, CONFIG, timing=SHORT) as run:
        await run.registered({GPU_RESOURCE: 8})
        uuid = run.gpu_uuids()[GPU_INDEX]
        await run.edit_node(_edit_gpu(GPU_INDEX, SIGNALS["nvlink-down"][0]))
        await async_wait_until(lambda: _grade(run, uuid) == (Grade.DEGRADED, "nvlink-down"), WAIT)
        await run.edit_node(_edit_gpu(GPU_INDEX, _set(lost=True)))
        await async_wait_until(lambda: _grade(run, uuid) == (Grade.UNHEALTHY, "lost"), WAIT)
        # Reset: the links that stay down are not counted against it any more.
        await run.edit_node(_edit_gpu(GPU_INDEX, _set(lost=False)))
        await async_wait_until(
            lambda: _grade(run, uuid) == (Grade.HEALTHY, ""), WAIT + HOLD_S + SHORT.gpu_hold_s
        )
