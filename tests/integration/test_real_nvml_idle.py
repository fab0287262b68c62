"""An idle agent on the real NVML backend (pynvml over the project's NVML library) starts
no threads: its event waits, one per probe period, run on a thread that lives as long as NVML
does, and XIDs still arrive through it."""

from __future__ import annotations

import os
import time
from pathlib import Path

from agents.standin.kubelet import Kubelet
from tests.conditions import PROCESS_WAIT as START_WAIT
from tests.conditions import async_wait_until
from tests.nvml.harness import Lab, health, start_agent, unhealthy
from tests.timing import SHORT

FAULT_SEEN_WITHIN = 2.0
WAIT_PERIODS = 5  # event waits at rest, each of SHORT.gpu_probe_s
XID_FALLEN_OFF_BUS = 79


def thread_ids(pid: int) -> set[int]:
    return {int(tid) for tid in os.listdir(f"/proc/{pid}/task")}


async def test_an_idle_agent_starts_no_thread_across_event_waits_and_still_sees_xids(
    tmp_path: Path, plugin_dir: Path
) -> None:
    lab = Lab("own", "h100", tmp_path)
    kubelet = Kubelet(plugin_dir, seed=3)
    await kubelet.start()
    agent = start_agent(lab, plugin_dir, tmp_path / "agent.stderr", short_timing=True)
    pid = agent.process.pid
    try:
        await kubelet.wait_until(lambda k: len(health(k)) == 8 and not unhealthy(k), START_WAIT)
        # An XID seen through the event wait: it is running, its thread among these.
        lab.node.xid(0, XID_FALLEN_OFF_BUS)
        lab.apply()
        await kubelet.wait_until(lambda k: unhealthy(k) == {lab.uuids[0]}, FAULT_SEEN_WITHIN * 2)
        first = thread_ids(pid)
        began = time.monotonic()
        new: set[int] = set()

        def rested_or_threaded() -> bool:
            new.update(thread_ids(pid) - first)
            return bool(new) or time.monotonic() - began >= WAIT_PERIODS * SHORT.gpu_probe_s

        # The rest itself is the measure: every thread ID listed meanwhile is looked at.
        await async_wait_until(rested_or_threaded, WAIT_PERIODS * SHORT.gpu_probe_s + 10)
        assert not new, f"threads started at rest: {sorted(new)}"
        assert thread_ids(pid) == first
        lab.node.xid(5, XID_FALLEN_OFF_BUS)
        lab.apply()
        want = {lab.uuids[0], lab.uuids[5]}
        await kubelet.wait_until(lambda k: unhealthy(k) == want, FAULT_SEEN_WITHIN * 2)
        assert agent.alive()
    finally:
        agent.stop()
        await kubelet.stop()
        print(agent.stderr[-3000:])
