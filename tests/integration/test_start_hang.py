"""SIGTERM while NVML hangs at start-up (its initialisation, or a GPU that never answers
during discovery): the agent exits at once with 0 and leaves no socket, since discovery
runs off the event loop that handles the signal. Real backend over the tests' NVML."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agents.standin.kubelet import Kubelet
from tests.conditions import async_wait_until
from tests.nvml.harness import Lab, start_agent
from tests.nvml.state import HANG_FOREVER_MS

SIGTERM_WITHIN = 2.0
STARTUP = 20.0  # a new Python process and its imports, on a loaded 2-core machine


def nvml_loaded(pid: int) -> bool:
    """Whether the process has mapped the NVML library: it has called nvmlInit."""
    return "libnvidia-ml.so" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("hang", ["init", "discovery"])
async def test_sigterm_during_a_hung_start_exits_0_at_once_and_leaves_no_socket(
    hang: str, tmp_path: Path, plugin_dir: Path
) -> None:
    lab = Lab("own", "h100", tmp_path)
    if hang == "init":
        lab.node.init_hang_ms = HANG_FOREVER_MS
        lab.apply()
    else:
        lab.fail(3, "hang")  # every call about GPU 3 blocks, its discovery included
    kubelet = Kubelet(plugin_dir, seed=1)
    await kubelet.start()
    agent = start_agent(lab, plugin_dir, tmp_path / "agent.stderr")
    try:
        await async_wait_until(lambda: nvml_loaded(agent.process.pid), STARTUP, "NVML initialising")
        assert agent.alive()

        code, took = agent.terminate(10)

        assert code == 0, agent.stderr
        assert took < SIGTERM_WITHIN, f"exit took {took:.2f} s"
        assert "agent_stopped" in agent.stderr
        assert not [p for p in os.listdir(plugin_dir) if p.startswith("node-agent-")]
        assert kubelet.registrations == []
    finally:
        agent.stop()
        await kubelet.stop()
