"""`node-agent demo` from start to end on its bundled node: what README.md promises it
shows, down to the two DRA shares of one GPU with their MPS limits."""

from __future__ import annotations

import tempfile
from pathlib import Path

from agents.demo import Demo


async def test_the_demo_tells_its_whole_story() -> None:
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="demo-") as work:  # short: socket paths
        await Demo(Path(work), lines.append).run()
    text = "\n".join(lines)
    assert "Registered with the kubelet" in text
    assert "nvidia.com/gpu.product=" in text
    assert "Pod trainer-0/train" in text and "<->" in text
    assert "Unhealthy after" in text and "Healthy again after" in text
    assert "Degraded after" in text
    assert "Agent stopped; its sockets removed: yes." in text
    shares = text[text.index("DRA shares") :].splitlines()
    assert "    env CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M" in shares
    assert "    env CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in shares
    assert "  GPU0 compute mode while they run: EXCLUSIVE_PROCESS" in shares
    assert shares[-1] == "  both unprepared: GPU0 compute mode DEFAULT"
