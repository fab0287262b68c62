"""DRA shares' MPS control daemon through a real `node-agent run --api dra` process, the
kubelet's DRA calls and the API-server stand-in: the daemon runs before the first share,
the share's GPU is set EXCLUSIVE_PROCESS, and a daemon killed makes that GPU Unhealthy (the
health stream and the slice say so) until the agent has started it again, the claim kept
throughout and the daemon never told to quit."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from agents.api import dra_health_pb2
from agents.sim.mps_control import LOG_FILE, PID_FILE
from agents.sim.root import SUBTREE
from tests.conditions import PROCESS_WAIT as WAIT
from tests.integration.dra_node import GPU, DraNode, dra_node
from tests.integration.test_dra_health import watching
from tests.integration.test_dra_shares import SHARE_A, env, prepared, share, shared_config
from tests.timing import SHORT

__all__ = ["dra_node"]

PIPES = Path("run/nvidia/mps/gpu.nvidia.com")


def pid_of(pipe: Path) -> int | None:
    path = pipe / PID_FILE
    return int(path.read_text()) if path.exists() else None


async def test_the_agents_daemon_serves_shares_and_when_killed_their_gpu_is_unhealthy_a_while(
    dra_node: DraNode, node_file: Path, tmp_path: Path
) -> None:
    config = shared_config(node_file, tmp_path, "mps")
    parent = tmp_path / "sim"
    agent = await dra_node.start(node_file, "--config", str(config), "--simulate-root", str(parent))
    pipes = parent / SUBTREE / PIPES
    first = pid_of(pipes / "pipe")
    assert first is not None  # started before any share was asked for
    healthy, unhealthy = dra_health_pb2.HEALTHY, dra_health_pb2.UNHEALTHY
    try:
        async with watching(dra_node, "gpu-0") as seen:
            await dra_node.wait(lambda: seen == [healthy])
            share(dra_node, "a", SHARE_A)
            answer = await prepared(dra_node, "a")
            assert answer[0] == ""
            assert env(dra_node, "a")["CUDA_MPS_PIPE_DIRECTORY"] == f"/mps/{GPU}/pipe"
            assert "gpu_compute_mode_set" in agent.stderr and "EXCLUSIVE_PROCESS" in agent.stderr

            killed = time.monotonic()
            os.kill(first, signal.SIGKILL)
            await dra_node.wait(lambda: seen == [healthy, unhealthy])
            down = time.monotonic() - killed
            devices = dra_node.devices(GPU)
            assert "gpu-0" not in devices and "gpu-1" in devices  # only the GPU with shares
            await dra_node.wait(
                lambda: seen == [healthy, unhealthy, healthy], WAIT + SHORT.mps_restart_s
            )
            back = time.monotonic() - killed
            print(
                f"daemon killed -> Unhealthy after {down * 1000:.0f} ms, Healthy after {back:.1f} s"
            )
            assert pid_of(pipes / "pipe") not in (None, first)  # the agent started it again
            assert "gpu-0" in dra_node.devices(GPU)
            assert await prepared(dra_node, "a") == answer  # the claim kept throughout
        told = (pipes / "log" / LOG_FILE).read_text().splitlines()
        assert "quit" not in told and not [c for c in told if c.startswith("set_")]
        assert agent.terminate() == 0
    finally:  # the test's doing: the twin also ends once the agent's tree is gone
        pid = pid_of(pipes / "pipe")
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)


async def test_a_restarted_agent_process_adopts_the_daemon_its_shares_use(
    dra_node: DraNode, node_file: Path, tmp_path: Path
) -> None:
    config = shared_config(node_file, tmp_path, "mps")
    parent = tmp_path / "sim"
    args = ("--config", str(config), "--simulate-root", str(parent))
    agent = await dra_node.start(node_file, *args)
    pipes = parent / SUBTREE / PIPES
    try:
        share(dra_node, "a", SHARE_A)
        assert (await prepared(dra_node, "a"))[0] == ""
        first, socket = pid_of(pipes / "pipe"), (pipes / "pipe" / "control").stat().st_ino
        assert agent.terminate() == 0
        assert pid_of(pipes / "pipe") == first  # the simulated host's /run outlives the agent
        again = await dra_node.start(node_file, *args)
        assert "mps_daemon_adopted" in again.stderr and "mps_daemon_started" not in again.stderr
        assert pid_of(pipes / "pipe") == first
        assert (pipes / "pipe" / "control").stat().st_ino == socket  # pods' mounts still good
        assert env(dra_node, "a")["CUDA_MPS_PIPE_DIRECTORY"] == f"/mps/{GPU}/pipe"
        assert again.terminate() == 0
    finally:
        pid = pid_of(pipes / "pipe")
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
