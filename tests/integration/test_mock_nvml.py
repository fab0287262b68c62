"""The real NVML backend (pynvml over ctypes, no --simulate) on NVIDIA's mock
libnvidia-ml, on every GPU profile: it starts, advertises every GPU by UUID, answers
Allocate, and turns exactly the GPU that the mock fails Unhealthy while it keeps serving;
SIGTERM exits 0. Whole GPUs and time-shared replicas."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.gpu.allocation import VISIBLE_DEVICES
from agents.standin.kubelet import Container, Kubelet, Pod
from tests.integration.mocknvml import (
    NVSWITCH_PROFILES,
    OVERRIDES_TTL_S,
    PROFILES,
    REPO,
    MockAgent,
    mock_env,
    profile_numa,
    profile_uuids,
    require_mock,
    start_mock_agent,
    write_overrides,
)

GPU = "nvidia.com/gpu"
START_WAIT = 30.0  # a subprocess start on a loaded 2-core machine
FAULT_SEEN_WITHIN = 2.0  # after the mock shows the fault (it re-reads overrides every TTL)
FAULTS = {1: "fallen_off_bus", 2: "ecc_uncorrectable", 3: "lost"}  # NVML index -> mode
SIGTERM_WITHIN = 5.0


@dataclass
class Run:
    kubelet: Kubelet
    agent: MockAgent
    overrides: Path
    uuids: list[str]
    replicas: int
    profile: str

    def ids(self, indices: Iterable[int] | None = None) -> set[str]:
        """Device IDs of the GPUs at these NVML indices (all GPUs by default)."""
        gpus = self.uuids if indices is None else [self.uuids[i] for i in indices]
        if self.replicas == 1:
            return set(gpus)
        return {f"{u}::{n}" for u in gpus for n in range(self.replicas)}

    def health(self) -> dict[str, str]:
        view = self.kubelet.resource(GPU)
        if view is None or not view.connected:
            return {}
        return {i: s.health for i, s in view.devices.items()}

    def unhealthy(self) -> set[str]:
        return {i for i, h in self.health().items() if h != "Healthy"}


@pytest.fixture(params=[1, 2], ids=["whole-gpus", "time-sliced-2"])
def replicas(request: pytest.FixtureRequest) -> int:
    return int(request.param)


@pytest.fixture(params=PROFILES)
async def run(
    request: pytest.FixtureRequest, replicas: int, tmp_path: Path, plugin_dir: Path
) -> AsyncIterator[Run]:
    require_mock()
    profile = str(request.param)
    kubelet = Kubelet(plugin_dir, seed=5)
    await kubelet.start()
    args: list[str] = []
    if replicas > 1:
        config = tmp_path / "config.yaml"
        config.write_text(
            f"sharing: {{timeSlicing: {{resources: [{{name: {GPU}, replicas: {replicas}}}]}}}}\n"
        )
        args = ["--config", str(config)]
    overrides = tmp_path / "overrides.yaml"
    agent = start_mock_agent(profile, plugin_dir, overrides, tmp_path / "agent.stderr", *args)
    try:
        yield Run(kubelet, agent, overrides, profile_uuids(profile), replicas, profile)
    finally:
        if agent.alive():
            agent.process.kill()
        agent.process.wait(10)
        await kubelet.stop()
        print(agent.stderr[-3000:])


async def test_real_backend_on_mock_nvml_serves_and_reports_each_injected_fault(
    run: Run, request: pytest.FixtureRequest
) -> None:
    all_ids = run.ids()
    await run.kubelet.wait_until(
        lambda k: run.health() == dict.fromkeys(all_ids, "Healthy"), START_WAIT
    )
    registered = time.monotonic() - run.agent.started
    _check_numa(run)

    pod = await run.kubelet.admit(Pod("two", [Container("c", {GPU: 2})]))
    visible = pod.containers["c"].responses[GPU].envs[VISIBLE_DEVICES].split(",")
    assert len(visible) == 2 and set(visible) <= set(run.uuids)
    await run.kubelet.release("two")

    seen: dict[str, float] = {}
    failing: dict[int, str] = {}
    for index, mode in FAULTS.items():
        failing[index] = mode
        write_overrides(run.overrides, failing)
        began = time.monotonic()
        want = run.ids(list(failing))
        await run.kubelet.wait_until(lambda _k, want=want: run.unhealthy() == want, 10)
        seen[mode] = time.monotonic() - began
        assert seen[mode] < OVERRIDES_TTL_S + FAULT_SEEN_WITHIN, (mode, seen[mode])
        assert run.agent.alive()

    # Still serving: a GPU that no fault touched is allocated.
    pod = await run.kubelet.admit(Pod("one", [Container("c", {GPU: 1})]))
    assert pod.containers["c"].responses[GPU].envs[VISIBLE_DEVICES] == run.uuids[0]

    code, took = run.agent.terminate(SIGTERM_WITHIN)
    assert code == 0, run.agent.stderr[-2000:]
    assert "Traceback" not in run.agent.stderr
    figures = " ".join(f"{m}={s:.2f}s" for m, s in seen.items())
    print(
        f"MOCKNVML {request.node.callspec.id} gpus={len(run.uuids)} "
        f"registered={registered:.2f}s {figures} sigterm={took:.2f}s"
    )


@pytest.mark.parametrize("mode", ["fallen_off_bus", "lost", "ecc_uncorrectable"])
async def test_a_gpu_failed_before_start_is_advertised_and_only_it_unhealthy(
    mode: str, tmp_path: Path, plugin_dir: Path
) -> None:
    require_mock()
    uuids = profile_uuids("h100")
    kubelet = Kubelet(plugin_dir, seed=5)
    await kubelet.start()
    agent = start_mock_agent(
        "h100", plugin_dir, tmp_path / "o.yaml", tmp_path / "a.stderr", failing={2: mode}
    )
    try:
        # An ECC count already there at start is no news: only one that grows is.
        want = {u: "Healthy" for u in uuids} | {uuids[2]: _at_start(mode)}

        def as_wanted(k: Kubelet) -> bool:
            view = k.resource(GPU)
            return view is not None and {i: s.health for i, s in view.devices.items()} == want

        await kubelet.wait_until(as_wanted, START_WAIT)
        assert agent.terminate(SIGTERM_WITHIN)[0] == 0
    finally:
        if agent.alive():
            agent.process.kill()
        agent.process.wait(10)
        await kubelet.stop()


def _at_start(mode: str) -> str:
    return "Healthy" if mode == "ecc_uncorrectable" else "Unhealthy"


def _check_numa(run: Run) -> None:
    """Each GPU reports the NUMA node that sysfs has for its PCI address, or none."""
    view = run.kubelet.resource(GPU)
    assert view is not None
    numa = profile_numa(run.profile)
    assert {d: s.numa for d, s in view.devices.items()} == {
        d: numa[d.split("::")[0]] for d in view.devices
    }


@pytest.mark.parametrize("profile", PROFILES)
def test_topo_on_mock_nvml_shows_the_nvlink_fabric(profile: str, tmp_path: Path) -> None:
    require_mock()
    done = subprocess.run(
        [sys.executable, "-m", "agents.cli", "topo", "--json"],
        env=mock_env(profile, tmp_path / "none.yaml"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    uuids = profile_uuids(profile)
    assert [g["uuid"] for g in report["gpus"]] == uuids
    gpu_names = [g["name"] for g in report["gpus"]]
    cells = {report["matrix"][a][b] for a in gpu_names for b in gpu_names if a != b}
    if profile in NVSWITCH_PROFILES:
        assert len(cells) == 1 and cells.pop().startswith("NV"), cells
    else:
        assert not any(c.startswith("NV") for c in cells), cells


def test_real_gpu_smoke_script_waits_for_the_first_device_list_on_mock_nvml(
    tmp_path: Path,
) -> None:
    require_mock()
    done = subprocess.run(
        [sys.executable, str(REPO / "hack" / "real_gpu.py")],
        cwd=REPO,
        env=mock_env("h100", tmp_path / "none.yaml"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "nvidia.com/gpu: 8 devices, 8 healthy" in done.stdout
    assert "NVIDIA_VISIBLE_DEVICES=GPU-01000100-" in done.stdout
