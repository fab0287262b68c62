"""The NVLink fabric's health on a simulated GB200 tray while the agent runs: a health
condition or a failed registration makes the GPU Degraded within a probe period, with the
cause named in the Event, chosen last; Healthy after holdS; the clique label unchanged."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agents.cluster.client import Access, ApiClient
from agents.cluster.reporter import Reporter
from agents.core.health import Grade
from agents.gpu.family import GpuFamily
from agents.gpu.plan import GPU_RESOURCE
from tests.conditions import WAIT, async_wait_until
from tests.integration.gpu_agent import Running, running_agent
from tests.standin.apiserver import ApiServer
from tests.timing import SHORT

NODE = "gb200-tray-1"
HOLD_S = 1
CONFIG = f"version: v1\nhealth:\n  degraded:\n    holdS: {HOLD_S}\n"
CLIQUE = "nvidia.com/gpu.clique"
ATTACHED = "5a1e2b3c-4d5e-4f60-8172-839405a6b7c8.1"  # gb200-4gpu-4nic's cluster, clique 1
# The node file's reload (inotify, then a parse) ahead of the next probe.
DETECT_S = SHORT.signal_probe_s + 1.0


@dataclass
class Tray:
    run: Running
    server: ApiServer

    def grade(self, uuid: str) -> tuple[Grade, str]:
        family = self.run.agent.family(GpuFamily)
        assert family is not None
        [health] = [h for h in family.device_health() if h.device_id == uuid]
        return health.grade, "" if health.cause is None else health.cause.text()

    def events(self, reason: str) -> list[str]:
        items = self.server.store.event_list("default")["items"]
        return [e["message"] for e in items if e["reason"] == reason]

    async def preferred(self, size: int) -> set[str]:
        endpoint = self.run.kubelet.endpoint(GPU_RESOURCE)
        assert endpoint is not None
        return set(await endpoint.preferred(self.run.gpu_uuids(), [], size))


@contextlib.asynccontextmanager
async def tray(tmp_path: Path) -> AsyncIterator[Tray]:
    server = ApiServer((NODE,))
    await server.start()
    reporter = Reporter(NODE, ApiClient(Access(server.url), timeout_s=0.5), max_retry_s=0.5)
    try:
        async with running_agent(
            tmp_path, CONFIG, node="gb200-4gpu-4nic", reporter=reporter, timing=SHORT
        ) as run:
            await run.registered({GPU_RESOURCE: 4})
            await async_wait_until(lambda: run.agent.labels().get(CLIQUE) == ATTACHED, WAIT)
            yield Tray(run, server)
    finally:
        await server.stop()


def _fabric(index: int, **fields: Any) -> Any:
    def edit(doc: dict[str, Any]) -> None:
        fabric = doc["gpus"][index]["fabric"]
        fabric.update(fields)
        for key in [k for k, v in fabric.items() if v is None]:
            del fabric[key]

    return edit


@pytest.mark.parametrize(
    ("fault", "cause"),
    [
        ({"health": ["routeUnhealthy"]}, "NVLink fabric: route unhealthy"),
        (
            {"health": ["degradedBandwidth", "noPartition"]},
            "NVLink fabric: degraded bandwidth, incorrect configuration (no partition)",
        ),
        (
            {"status": "NotReady"},
            "NVLink fabric: registration failed (NVML status NotReady)",
        ),
    ],
    ids=["route-unhealthy", "bandwidth-and-configuration", "registration-failed"],
)
async def test_a_fabric_fault_degrades_the_gpu_with_its_cause_and_leaves_the_clique(
    tmp_path: Path, fault: dict[str, Any], cause: str
) -> None:
    async with tray(tmp_path) as t:
        baseline = await t.preferred(3)
        index, uuid = next((i, u) for i, u in enumerate(t.run.gpu_uuids()) if u in baseline)

        await t.run.edit_node(_fabric(index, **fault))
        began = time.monotonic()
        await async_wait_until(lambda: t.grade(uuid) == (Grade.DEGRADED, cause), WAIT)
        detected_s = time.monotonic() - began
        event = f"{GPU_RESOURCE} device {uuid} (GPU {index}) is Degraded: {cause}"
        await async_wait_until(lambda: event in t.events("DeviceDegraded"), WAIT)
        assert uuid not in await t.preferred(3)  # the other three are Healthy
        assert t.run.devices()[uuid] == "Healthy"  # the kubelet keeps counting it
        assert t.run.agent.labels()[CLIQUE] == ATTACHED

        await t.run.edit_node(_fabric(index, health=None, status=None))
        began = time.monotonic()
        await async_wait_until(lambda: t.grade(uuid) == (Grade.HEALTHY, ""), WAIT + HOLD_S)
        healthy_s = time.monotonic() - began
        await async_wait_until(lambda: t.events("DeviceHealthy") != [], WAIT)
        assert await t.preferred(3) == baseline
        assert t.run.agent.labels()[CLIQUE] == ATTACHED
    print(f"\n{cause}: Degraded after {detected_s:.2f} s, Healthy after {healthy_s:.2f} s")
    assert detected_s < DETECT_S
    assert healthy_s >= HOLD_S - 2 * SHORT.signal_probe_s
