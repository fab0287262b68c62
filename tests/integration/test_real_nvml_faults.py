"""NVML misbehaving under the real backend (pynvml, no --simulate) over the project's
NVML library: error answers (NVML's documented NO_PERMISSION, UNKNOWN, NOT_SUPPORTED), a
call that never returns, a GPU lost and reset, an XID after a lost GPU earlier in the
index order, and a GPU taken off the node."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from agents.gpu.allocation import VISIBLE_DEVICES
from agents.standin.kubelet import Container, Kubelet, Pod
from tests.conditions import PROCESS_WAIT as START_WAIT
from tests.nvml.harness import AgentProcess, Lab, health, start_agent, unhealthy
from tests.timing import SHORT

GPU = "nvidia.com/gpu"
FAULT_SEEN_WITHIN = 2.0
SIGTERM_WITHIN = 2.0


@dataclass
class Run:
    kubelet: Kubelet
    agent: AgentProcess
    lab: Lab

    def health(self) -> dict[str, str]:
        return health(self.kubelet)

    def unhealthy(self) -> set[str]:
        return unhealthy(self.kubelet)

    async def shows(self, unhealthy: set[int], within: float) -> float:
        """Seconds until exactly the GPUs at these indices are Unhealthy."""
        want = {self.lab.uuids[i] for i in unhealthy}
        began = time.monotonic()
        await self.kubelet.wait_until(lambda _k: self.unhealthy() == want, within)
        return time.monotonic() - began


@asynccontextmanager
async def running(tmp_path: Path, plugin_dir: Path) -> AsyncIterator[Run]:
    lab = Lab("own", "h100", tmp_path)
    kubelet = Kubelet(plugin_dir, seed=3)
    await kubelet.start()
    agent = start_agent(lab, plugin_dir, tmp_path / "agent.stderr", short_timing=True)
    try:
        run = Run(kubelet, agent, lab)
        await kubelet.wait_until(lambda _k: len(run.health()) == 8, START_WAIT)
        await run.shows(set(), START_WAIT)
        yield run
    finally:
        agent.stop()
        await kubelet.stop()
        print(agent.stderr[-3000:])


@pytest.mark.parametrize("mode", ["Unknown", "NoPermission"])
async def test_an_error_answer_turns_the_gpu_unhealthy_until_it_answers_for_the_hold(
    mode: str, tmp_path: Path, plugin_dir: Path
) -> None:
    async with running(tmp_path, plugin_dir) as run:
        run.lab.fail(2, mode)
        assert await run.shows({2}, FAULT_SEEN_WITHIN * 2) < FAULT_SEEN_WITHIN
        assert len(run.health()) == 8  # still listed
        run.lab.reset(2)
        healed = await run.shows(set(), SHORT.gpu_hold_s + FAULT_SEEN_WITHIN * 2)
        assert healed >= SHORT.gpu_hold_s - 0.1  # the hold: NVML answers normally for a while first
        assert run.agent.alive()


async def test_not_supported_answers_are_no_fault(tmp_path: Path, plugin_dir: Path) -> None:
    """NOT_SUPPORTED means the GPU has no such counter (e.g. no ECC): it answered."""
    async with running(tmp_path, plugin_dir) as run:
        run.lab.node.gpus[5].fails["nvmlDeviceGetTotalEccErrors"] = 3
        run.lab.node.gpus[6].ecc = False
        run.lab.fail(1, "lost")  # a fault after them: once it shows, they were probed
        await run.shows({1}, FAULT_SEEN_WITHIN * 2)
        assert run.agent.alive()


async def test_a_lost_gpu_does_not_make_the_gpus_after_it_look_lost(
    tmp_path: Path, plugin_dir: Path
) -> None:
    """NVML documents GPU_IS_LOST from a lookup by UUID when any GPU fell off the bus:
    the GPUs after a lost one in index order must stay Healthy all the same."""
    async with running(tmp_path, plugin_dir) as run:
        run.lab.fail(0, "fallen_off_bus")
        await run.shows({0}, FAULT_SEEN_WITHIN * 2)
        run.lab.node.xid(6, 79)
        run.lab.apply()
        await run.shows({0, 6}, FAULT_SEEN_WITHIN * 2)
        pod = await run.kubelet.admit(Pod("p", [Container("c", {GPU: 2})]))
        visible = set(pod.containers["c"].responses[GPU].envs[VISIBLE_DEVICES].split(","))
        assert visible <= set(run.lab.uuids[1:6] + run.lab.uuids[7:])


async def test_a_reset_gpu_is_healthy_again(tmp_path: Path, plugin_dir: Path) -> None:
    async with running(tmp_path, plugin_dir) as run:
        run.lab.fail(4, "fallen_off_bus")
        await run.shows({4}, FAULT_SEEN_WITHIN * 2)
        run.lab.reset(4)
        await run.shows(set(), SHORT.gpu_hold_s + FAULT_SEEN_WITHIN * 2)


async def test_a_hung_gpu_turns_unhealthy_after_the_bound_and_blocks_nothing_else(
    tmp_path: Path, plugin_dir: Path
) -> None:
    # GPU 5's fault must show while GPU 3 hangs and is not yet marked for it.
    assert SHORT.gpu_hang_s > FAULT_SEEN_WITHIN
    async with running(tmp_path, plugin_dir) as run:
        run.lab.fail(3, "hang")
        began = time.monotonic()
        # While GPU 3's calls hang: another GPU's fault shows, and Allocate answers.
        run.lab.fail(5, "lost")
        await run.shows({5}, FAULT_SEEN_WITHIN * 2)
        pod = await run.kubelet.admit(Pod("p", [Container("c", {GPU: 1})]))
        assert pod.containers["c"].responses[GPU].envs[VISIBLE_DEVICES]
        await run.shows({3, 5}, SHORT.gpu_hang_s + FAULT_SEEN_WITHIN * 2)
        assert time.monotonic() - began >= SHORT.gpu_hang_s  # not before the hang bound
        code, took = run.agent.terminate(SIGTERM_WITHIN * 2)
        assert code == 0 and took < SIGTERM_WITHIN, (code, took)


async def test_a_gpu_taken_off_the_node_turns_unhealthy(tmp_path: Path, plugin_dir: Path) -> None:
    async with running(tmp_path, plugin_dir) as run:
        run.lab.node.gpus[7].removed = True
        run.lab.apply()
        await run.shows({7}, FAULT_SEEN_WITHIN * 2)
        assert run.agent.alive()
