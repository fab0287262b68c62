"""NVML misbehaving on a simulated node (`nvml: {hang, error}` of the node file) and an NVSwitch
node (`nvswitch: true`): a transient error turns a GPU Unhealthy without removing it, a
hung GPU turns Unhealthy after the hang bound while the others are still probed, stopping
never waits for a hung call, and GPUs on one NVSwitch fabric are all NVLink-connected."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.config import Config
from agents.core.health import GpuLost, NvmlHung
from agents.gpu.discovery import discover, gpu_distance, nvlink_counts
from agents.gpu.plan import GPU_RESOURCE
from agents.hw.nvml import NVSWITCH_BUS_ID
from agents.sim.bundled import bundled_node
from agents.sim.simnode import SimulatedNode
from agents.tasks import until
from agents.timing import Timing
from hack.benchlib.gpu_choice import choose_gpus
from tests.conditions import async_wait_until, wait_until
from tests.families import gpu_family
from tests.integration.gpu_agent import running_agent
from tests.timing import SHORT

FAULT_SEEN_WITHIN = 2.0
HANG_BOUND_S = 1.0  # the family's hang bound in these tests (10 s in the agent)


async def test_transient_nvml_error_marks_unhealthy_keeps_listed_and_heals_after_hold(
    tmp_path: Path,
) -> None:
    async with running_agent(tmp_path, timing=SHORT) as run:
        uuids = run.gpu_uuids()
        await run.registered({GPU_RESOURCE: 8})
        await run.edit_node(lambda d: d["gpus"][2].__setitem__("nvml", {"error": "Unknown"}))
        began = time.monotonic()
        await run.kubelet.wait_until(
            lambda _: run.devices().get(uuids[2]) == "Unhealthy", FAULT_SEEN_WITHIN * 2
        )
        assert time.monotonic() - began < FAULT_SEEN_WITHIN
        assert len(run.devices()) == 8  # never removed
        assert sum(h == "Healthy" for h in run.devices().values()) == 7

        await run.edit_node(lambda d: d["gpus"][2].pop("nvml"))
        began = time.monotonic()
        await run.kubelet.wait_until(
            lambda _: run.devices().get(uuids[2]) == "Healthy",
            SHORT.gpu_hold_s + FAULT_SEEN_WITHIN * 2,
        )
        assert time.monotonic() - began >= SHORT.gpu_hold_s


async def test_opt_in_xid_recovery_heals_a_critical_xid_after_its_period(
    tmp_path: Path,
) -> None:
    async with running_agent(tmp_path, "health: {xidRecovery: 2}") as run:
        uuids = run.gpu_uuids()
        await run.registered({GPU_RESOURCE: 8})
        await run.edit_node(lambda d: d["gpus"][4]["xids"].append(48))
        await run.kubelet.wait_until(
            lambda _: run.devices().get(uuids[4]) == "Unhealthy", FAULT_SEEN_WITHIN * 2
        )
        began = time.monotonic()
        await run.kubelet.wait_until(
            lambda _: run.devices().get(uuids[4]) == "Healthy", 2 + FAULT_SEEN_WITHIN * 2
        )
        assert time.monotonic() - began >= 2 - 1.0  # the period runs from the XID itself


def _edit(node_file: Path, change: Any) -> None:
    doc = yaml.safe_load(node_file.read_text())
    change(doc)
    tmp = node_file.with_name(".node.tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    tmp.replace(node_file)


async def test_hung_gpu_turns_unhealthy_after_the_bound_while_others_are_still_probed(
    tmp_path: Path,
) -> None:
    node_file = tmp_path / "node.yaml"
    shutil.copy(bundled_node("h100-8gpu-8nic"), node_file)
    node = SimulatedNode(node_file, tmp_path / "root")
    node.load()
    family = gpu_family(
        node.nvml, node.sysfs, Config.default(), timing=Timing(gpu_hang_s=HANG_BOUND_S)
    )
    uuids = [g.uuid for g in family.gpus]
    stop = asyncio.Event()
    tasks = [
        asyncio.ensure_future(until(stop, family.run)),
        asyncio.ensure_future(until(stop, node.run)),
    ]
    try:
        await asyncio.wait_for(node.watching.wait(), 5)
        _edit(node_file, lambda d: d["gpus"][2].__setitem__("nvml", {"hang": 30}))
        began = time.monotonic()
        await async_wait_until(lambda: family.unhealthy_cause(uuids[2]) == NvmlHung(), 10, "hung")
        hung_after = time.monotonic() - began
        assert HANG_BOUND_S <= hung_after < HANG_BOUND_S + FAULT_SEEN_WITHIN

        # Another GPU falls off the bus: seen by the probe while GPU 2 still hangs.
        _edit(node_file, lambda d: d["gpus"][5].__setitem__("lost", True))
        began = time.monotonic()
        await async_wait_until(lambda: family.unhealthy_cause(uuids[5]) == GpuLost(), 5, "lost")
        assert time.monotonic() - began < FAULT_SEEN_WITHIN
        assert family.healthy_count() == 6
    finally:
        stop.set()
        began = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert time.monotonic() - began < 2.0  # a call hung for 30 s holds nothing up


def test_sigterm_exits_within_two_seconds_while_nvml_calls_and_the_event_wait_hang(
    tmp_path: Path, plugin_dir: Path
) -> None:
    node_file = tmp_path / "node.yaml"
    shutil.copy(bundled_node("h100-8gpu-8nic"), node_file)
    stderr_path = tmp_path / "agent.stderr"
    with stderr_path.open("wb") as stderr:
        agent = subprocess.Popen(
            [
                *(sys.executable, "-m", "agents.cli", "run", "--families", "gpu"),
                *("--simulate", str(node_file), "--device-plugin-dir", str(plugin_dir)),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        wait_until(lambda: "plugin_serving" in stderr_path.read_text(), 30, "serving")
        _edit(node_file, lambda d: d["gpus"][1].__setitem__("nvml", {"hang": 600}))
        wait_until(
            lambda: all(
                e in stderr_path.read_text() for e in ("nvml_call_slow", "nvml_event_wait_slow")
            ),
            15,
            "an NVML call and the event wait hung",
        )
        began = time.monotonic()
        agent.send_signal(signal.SIGTERM)
        code = agent.wait(10)
        took = time.monotonic() - began
        print(f"SIGTERM with a hung NVML call and event wait: exit {code} after {took:.2f}s")
        assert code == 0, stderr_path.read_text()[-2000:]
        assert took < 2.0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(10)


def _nvswitch_node(tmp_path: Path) -> SimulatedNode:
    doc = yaml.safe_load(bundled_node("h100-8gpu-8nic").read_text())
    doc["nvswitch"] = True
    for gpu in doc["gpus"]:
        gpu["nvlinks"] = []
    # GPUs 0 and 1 share a PCIe switch (as on HGX boards), the others do not.
    doc["gpus"][1]["upstream"] = [*doc["gpus"][0]["upstream"][:-1], "0000:17:01.0"]
    node_file = tmp_path / "node.yaml"
    node_file.write_text(yaml.safe_dump(doc))
    node = SimulatedNode(node_file, tmp_path / "root")
    node.load()
    node.nvml.init()
    return node


def test_nvswitch_node_answers_nvlink_queries_as_hgx_does(tmp_path: Path) -> None:
    node = _nvswitch_node(tmp_path)
    for info in node.nvml.gpus():
        assert (info.nvlink_peers, info.nvswitch_links) == ((), 18)
    assert NVSWITCH_BUS_ID == "FFFFFFFF:FF:FF.0"


@pytest.mark.parametrize(
    ("must", "size", "expected"),
    [
        pytest.param([0], 2, [0, 1], id="pcie-switch-partner-first"),
        pytest.param([5], 2, None, id="same-numa-partner"),
        pytest.param([], 4, [0, 1, 2, 3], id="one-numa-node"),
    ],
)
def test_gpus_on_one_nvswitch_fabric_are_all_nvlinked_ties_by_pcie_then_numa(
    tmp_path: Path, must: list[int], size: int, expected: list[int] | None
) -> None:
    node = _nvswitch_node(tmp_path)
    gpus = discover(node.nvml, node.sysfs)
    uuids = [g.uuid for g in gpus]
    links = nvlink_counts(gpus)
    assert len(links) == 28 and set(links.values()) == {18}
    by_uuid = {g.uuid: g for g in gpus}
    chosen = choose_gpus(
        uuids,
        [uuids[i] for i in must],
        size,
        nvlinks=links,
        pcie=lambda a, b: gpu_distance(by_uuid[a], by_uuid[b]),
    )
    picked = sorted(uuids.index(u) for u in chosen)
    if expected is not None:
        assert picked == expected
    else:
        assert len(picked) == size and all(gpus[i].numa == gpus[must[0]].numa for i in picked)
