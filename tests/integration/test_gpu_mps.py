"""MPS-shared GPUs on a simulated node with `mps: {available: true}`, through the kubelet
stand-in: replicas registered, Allocate's pipe and shm, the GPUs' compute mode, the control
daemon's limits as the twin recorded them, and the daemon watched and adopted."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog
import yaml

from agents.config import parse_config
from agents.errors import BackendError
from agents.gpu.discovery import discover
from agents.gpu.mps import MpsDaemons
from agents.gpu.plan import plan_resources
from agents.hw.mps_control import MpsControlBinary
from agents.sim.bundled import bundled_node
from agents.sim.mps_control import CLIENTS, PID_FILE, SERVERS, install_twin
from agents.sim.nvml import SimNvml
from agents.sim.simnode import SimulatedNode
from agents.standin.kubelet import AdmissionError, Container, Kubelet, Pod
from agents.timing import Timing
from tests.conditions import WAIT, async_wait_until
from tests.integration.gpu_agent import Running, config, running_agent

MPS_CONFIG = """\
version: v1
flags: {mpsRoot: /run/nvidia/mps}
sharing:
  mps:
    renameByDefault: %s
    resources: [{name: nvidia.com/gpu, replicas: 4}]
"""
ROOT = "/run/nvidia/mps"
FAST = Timing(gpu_probe_s=0.05, mps_restart_s=3600.0)  # a dead daemon stays dead


def mps_node(tmp_path: Path) -> Path:
    doc = yaml.safe_load(bundled_node("h100-8gpu-8nic").read_text())
    doc["mps"] = {"available": True}
    path = tmp_path / "mps-node.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def dirs(running: Running, resource: str) -> tuple[str, str]:
    base = f"{running.sim.dev_root}{ROOT}/{resource}"
    return f"{base}/pipe", f"{base}/log"


def told(running: Running, resource: str) -> list[str]:
    return (Path(dirs(running, resource)[1]) / "control.log").read_text().splitlines()


def quit_daemon(running: Running, resource: str) -> None:
    assert running.backends.mps is not None
    running.backends.mps.send(*dirs(running, resource), "quit")


@pytest.mark.parametrize(
    ("rename", "resource"), [("false", "nvidia.com/gpu"), ("true", "nvidia.com/gpu.shared")]
)
async def test_mps_replicas_get_their_daemons_pipe_and_limits(
    tmp_path: Path, rename: str, resource: str
) -> None:
    async with running_agent(tmp_path, MPS_CONFIG % rename, node=mps_node(tmp_path)) as running:
        try:
            kubelet = running.kubelet
            await kubelet.wait_until(lambda k: k.capacity().get(resource) == 32, WAIT)
            ids = set(kubelet.resource(resource).devices)  # type: ignore[union-attr]
            assert all(i.startswith("GPU-") and i[-3:] in {"::0", "::1", "::2", "::3"} for i in ids)
            got = await kubelet.admit(Pod("p", [Container("c", {resource: 1})]))
            answer = got.containers["c"].responses[resource]
            assert answer.envs["CUDA_MPS_PIPE_DIRECTORY"] == f"/mps/{resource}/pipe"
            host = f"{running.sim.dev_root}{ROOT}"
            assert [(m.container_path, m.host_path, m.read_only) for m in answer.mounts] == [
                (f"/mps/{resource}/pipe", f"{host}/{resource}/pipe", False),
                ("/dev/shm", f"{host}/shm", False),
            ]
            with pytest.raises(AdmissionError, match="at most one shared device"):
                await kubelet.admit(Pod("two", [Container("c", {resource: 2})]))
            commands = told(running, resource)
            limits = [c for c in commands if c.startswith("set_default")]
            memory = [f"set_default_device_pinned_mem_limit {i} 20389M" for i in range(8)]
            assert limits == [*memory, "set_default_active_thread_percentage 25"]
        finally:
            quit_daemon(running, resource)


async def test_shared_gpus_are_exclusive_process_while_mps_serves_them_and_after_exit(
    tmp_path: Path,
) -> None:
    cfg = MPS_CONFIG % "false"
    async with running_agent(tmp_path, cfg, node=mps_node(tmp_path), timing=FAST) as running:
        try:
            await running.kubelet.wait_until(healthy, WAIT)
            uuids = running.gpu_uuids()
            assert [running.sim.nvml.compute_mode(u) for u in uuids] == ["EXCLUSIVE_PROCESS"] * 8
        finally:
            quit_daemon(running, "nvidia.com/gpu")  # the simulated root goes with the agent
    # A clean exit leaves them so: the daemon, not the agent, is what needs them.
    assert running.sim.nvml.compute_modes == dict.fromkeys(uuids, "EXCLUSIVE_PROCESS")


def unhealthy(kubelet: Kubelet) -> bool:
    view = kubelet.resource("nvidia.com/gpu")
    return view is not None and len(view.devices) == 32 and not view.healthy()


def healthy(kubelet: Kubelet) -> bool:
    view = kubelet.resource("nvidia.com/gpu")
    return view is not None and len(view.healthy()) == 32


async def test_a_dead_daemon_makes_its_replicas_unhealthy_until_it_answers_again(
    tmp_path: Path,
) -> None:
    cfg = MPS_CONFIG % "false"
    async with running_agent(tmp_path, cfg, node=mps_node(tmp_path), timing=FAST) as running:
        try:
            await running.kubelet.wait_until(healthy, WAIT)
            quit_daemon(running, "nvidia.com/gpu")
            await running.kubelet.wait_until(unhealthy, WAIT)
            assert running.backends.mps is not None
            running.backends.mps.start(*dirs(running, "nvidia.com/gpu"))  # an operator's
            await running.kubelet.wait_until(healthy, WAIT)
        finally:
            quit_daemon(running, "nvidia.com/gpu")


async def test_the_agent_starts_a_dead_daemon_again_with_its_limits(tmp_path: Path) -> None:
    timing = dataclasses.replace(FAST, mps_restart_s=0.2)
    cfg = MPS_CONFIG % "false"
    async with running_agent(tmp_path, cfg, node=mps_node(tmp_path), timing=timing) as running:
        try:
            await running.kubelet.wait_until(healthy, WAIT)
            quit_daemon(running, "nvidia.com/gpu")
            started = "set_default_active_thread_percentage 25"
            await running.kubelet.wait_until(
                lambda k: healthy(k) and told(running, "nvidia.com/gpu").count(started) == 2, WAIT
            )
        finally:
            quit_daemon(running, "nvidia.com/gpu")


CONTROL = "bin-root/usr/bin/nvidia-cuda-mps-control"


def shared(
    tmp_path: Path, *, privileged: bool = True, capability: str | None = None, replicas: int = 4
) -> tuple[SimNvml, Callable[[], MpsDaemons]]:
    """The simulated node's NVML, initialised, and a maker of the daemons of the MPS config
    on it (an agent's start), the twin as the program; its GPUs of `capability` if given."""
    path = mps_node(tmp_path)
    if capability is not None:
        doc = yaml.safe_load(path.read_text())
        for gpu in doc["gpus"]:
            gpu["computeCapability"] = capability
        path.write_text(yaml.safe_dump(doc))
    node = SimulatedNode(path, tmp_path / "root")
    node.load()
    control = MpsControlBinary(str(install_twin(tmp_path / "bin-root")))
    nvml = SimNvml(node.spec, privileged=privileged)
    nvml.init()
    gpus = discover(nvml, node.sysfs)
    text = MPS_CONFIG.replace("replicas: 4", f"replicas: {replicas}") % "false"
    plans = plan_resources(gpus, config(text), "c.yaml")
    return nvml, lambda: MpsDaemons(control, str(tmp_path / "mps"), plans, gpus, nvml)


def quit_all(tmp_path: Path, mps: MpsDaemons) -> None:
    for daemon in mps.daemons:
        MpsControlBinary(str(tmp_path / CONTROL)).send(daemon.pipe_dir, daemon.log_dir, "quit")


def test_a_restarted_agent_adopts_the_running_daemon_and_leaves_the_modes(tmp_path: Path) -> None:
    nvml, start = shared(tmp_path)
    first = start()
    first.ensure()
    (daemon,) = first.daemons
    pid = (Path(daemon.pipe_dir) / PID_FILE).read_text()
    gpu = sorted(daemon.gpus)[0]
    try:
        nvml.set_compute_mode(gpu, "DEFAULT")  # an operator's doing, say
        again = start()  # the agent, started again
        again.ensure()
        assert not again.down
        log = (Path(daemon.log_dir) / "control.log").read_text().splitlines()
        assert log.count("set_default_active_thread_percentage 25") == 1  # not started twice
        assert (Path(daemon.pipe_dir) / PID_FILE).read_text() == pid
        assert nvml.compute_mode(gpu) == "DEFAULT"  # adopted: its GPUs untouched
    finally:
        quit_all(tmp_path, first)


def test_no_daemon_starts_where_a_gpus_compute_mode_cannot_be_set(tmp_path: Path) -> None:
    mps = shared(tmp_path, privileged=False)[1]()
    (daemon,) = mps.daemons
    try:
        with structlog.testing.capture_logs() as logs:
            mps.ensure()
            assert not mps.restart()  # tried again, still refused, logged once
        assert mps.down == {"nvidia.com/gpu"}
        assert not (Path(daemon.pipe_dir) / PID_FILE).exists()  # as NVIDIA's: not started
        (warning,) = [e for e in logs if e["event"] == "mps_daemon_unavailable"]
        assert "Insufficient Permissions" in warning["reason"]
        assert mps.cause(sorted(daemon.gpus)[0]) is not None  # its replicas Unhealthy
    finally:
        if (Path(daemon.pipe_dir) / PID_FILE).exists():
            quit_all(tmp_path, mps)


@pytest.mark.parametrize(("replicas", "served"), [(16, True), (17, False)])
def test_more_than_16_replicas_of_a_gpu_older_than_compute_capability_7_5_start_no_daemon(
    tmp_path: Path, replicas: int, served: bool
) -> None:
    # a V100's compute capability: its MPS server takes 16 clients
    nvml, start = shared(tmp_path, capability="7.0", replicas=replicas)
    mps = start()
    (daemon,) = mps.daemons
    uuids = sorted(daemon.gpus)
    try:
        with structlog.testing.capture_logs() as logs:
            mps.ensure()
            mps.probe()
        assert (Path(daemon.pipe_dir) / PID_FILE).exists() is served
        assert (mps.cause(uuids[0]) is None) is served
        refused = [e["reason"] for e in logs if e["event"] == "mps_daemon_unavailable"]
        assert refused == (
            []
            if served
            else [
                "17 replicas of GPU 0 (compute capability 7.0): an MPS server below 7.5"
                " takes at most 16 clients"
            ]
        )
        assert all(
            nvml.compute_mode(u) == ("EXCLUSIVE_PROCESS" if served else "DEFAULT") for u in uuids
        )
    finally:
        if (Path(daemon.pipe_dir) / PID_FILE).exists():
            quit_all(tmp_path, mps)


async def test_a_reload_that_stops_mps_stops_its_daemon_once_its_clients_end(
    tmp_path: Path,
) -> None:
    cfg = MPS_CONFIG % "false"
    async with running_agent(tmp_path, cfg, node=mps_node(tmp_path), timing=FAST) as running:
        try:
            await running.kubelet.wait_until(healthy, WAIT)
            uuids = running.gpu_uuids()
            pipe = Path(dirs(running, "nvidia.com/gpu")[0])
            (pipe / SERVERS).write_text("4242\n")  # a server with a client: a pod from before
            (pipe / f"{CLIENTS}4242").write_text("4343\n")
            with structlog.testing.capture_logs() as logs:
                await running.agent.reload(parse_config("version: v1\n", "<test>"))
                await running.kubelet.wait_until(
                    lambda k: k.capacity().get("nvidia.com/gpu") == 8, WAIT
                )
                await async_wait_until(
                    lambda: any(e["event"] == "mps_daemon_retiring" for e in logs), WAIT, "wait"
                )
                assert (pipe / PID_FILE).exists()
                modes = running.sim.nvml.compute_modes
                assert [modes[u] for u in uuids] == ["EXCLUSIVE_PROCESS"] * 8  # still served
                (pipe / f"{CLIENTS}4242").write_text("")  # its last client ended
                await async_wait_until(
                    lambda: any(e["event"] == "mps_daemon_retired" for e in logs), WAIT, "retired"
                )
            assert "quit" in told(running, "nvidia.com/gpu")
            assert [running.sim.nvml.compute_mode(u) for u in uuids] == ["DEFAULT"] * 8
            [said] = [e for e in logs if e["event"] == "mps_daemon_retiring"]
            assert said["clients"] == ["4343"]
        finally:
            with contextlib.suppress(BackendError):
                quit_daemon(running, "nvidia.com/gpu")
