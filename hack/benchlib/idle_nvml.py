"""An idle agent on the real NVML backend (pynvml) over the tests' NVML library, an H100
node of 8 GPUs: its CPU across an idle window, and whether it starts threads meanwhile."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

from agents.standin.kubelet import Kubelet
from hack.benchlib.agent import GPU, proc_cpu_seconds, proc_thread_ids
from hack.benchlib.figures import Figure, below, info
from tests.nvml.harness import Lab, health, start_agent

PROFILE = "h100"
IDLE_CPU_LIMIT = 0.2  # % of one core
SAMPLE_S = 0.2  # how often the agent's threads are listed: a thread per wait lives ~1 s
SETTLE_S = 1.0  # start-up work ends before the window opens


async def idle_nvml(work: Path, idle_s: float) -> list[Figure]:
    lab = Lab("own", PROFILE, work)
    plugin_dir = Path(tempfile.mkdtemp(prefix="dp-"))  # a socket path fits in 108 bytes
    kubelet = Kubelet(plugin_dir, seed=1)
    await kubelet.start()
    agent = start_agent(lab, plugin_dir, work / "agent.stderr", "--log-format", "json")
    try:
        gpus = len(lab.uuids)

        def all_healthy(k: Kubelet) -> bool:
            states = health(k, GPU)
            return len(states) == gpus and set(states.values()) == {"Healthy"}

        await kubelet.wait_until(all_healthy, 30)
        await asyncio.sleep(SETTLE_S)
        pid = agent.process.pid
        first = proc_thread_ids(pid)
        seen = set(first)
        cpu_before, began = proc_cpu_seconds(pid), time.monotonic()
        while (left := began + idle_s - time.monotonic()) > 0:
            await asyncio.sleep(min(SAMPLE_S, left))  # a sampling period, not a sync
            seen |= proc_thread_ids(pid)
        cpu = proc_cpu_seconds(pid) - cpu_before
        window = time.monotonic() - began
        last = proc_thread_ids(pid)
        alive = agent.alive()
    finally:
        agent.stop()
        await kubelet.stop()
        shutil.rmtree(plugin_dir, ignore_errors=True)
    note = f"`node-agent run --families gpu` on pynvml over tests/nvml ({PROFILE}, {gpus} GPUs)"
    started = len(seen - first)
    return [
        below(
            "idle CPU, real NVML backend",
            cpu / window * 100,
            "%",
            IDLE_CPU_LIMIT,
            f"utime+stime over {window:.0f} s (clock tick {1000 // os.sysconf('SC_CLK_TCK')} ms); "
            + note,
        ),
        info("threads at idle start, real NVML backend", len(first), ""),
        Figure(
            "threads at idle end, real NVML backend",
            len(last),
            "",
            f"= {len(first)}",
            len(last) == len(first) and alive,
        ),
        Figure(
            "threads started while idle, real NVML backend",
            started,
            "",
            "0",
            started == 0,
            f"new thread IDs seen listing /proc/PID/task every {SAMPLE_S:g} s",
        ),
    ]
