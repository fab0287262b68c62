"""Acceptance (docs/configuration.md), through a real `node-agent run --simulate` process:
a config of the corpus marked `cli` registers and allocates as its case says, each ignored
key is named in one warning, and a refused one exits 2 with one line naming file and key."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.standin.kubelet import Kubelet
from tests.compat.corpus import REFUSED, SERVED, Case
from tests.compat.test_nvidia_configs import check_allocations, check_device_ids

CLI_SERVED = [c for c in SERVED if c.cli]
CLI_REFUSED = [c for c in REFUSED if c.cli]
START_WITHIN = 30.0  # a fresh interpreter on a loaded 2-core machine
EXIT_WITHIN = 30.0


def agent_command(case: Case, plugin_dir: Path, node: Path) -> list[str]:
    return [
        *(sys.executable, "-m", "agents.cli", "run", "--families", "gpu"),
        *("--simulate", str(node), "--config", str(case.config)),
        *("--device-plugin-dir", str(plugin_dir), "--log-format", "json"),
    ]


def events(stderr: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]


@pytest.mark.parametrize("case", CLI_SERVED, ids=[c.name for c in CLI_SERVED])
async def test_agent_process_serves_the_config_and_warns_once_per_ignored_key(
    case: Case, tmp_path: Path, plugin_dir: Path, kubelet: Kubelet
) -> None:
    node = tmp_path / "node.yaml"
    shutil.copy(case.node_file, node)
    stderr_path = tmp_path / "agent.stderr"
    with stderr_path.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            *agent_command(case, plugin_dir, node),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    try:
        await kubelet.wait_until(lambda k: k.capacity() == case.registered, START_WITHIN)
        check_device_ids(case, kubelet)
        await check_allocations(case, kubelet, None)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), EXIT_WITHIN) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await asyncio.wait_for(process.wait(), EXIT_WITHIN)
    logged = events(stderr_path.read_text())
    ignored = [e for e in logged if e["event"] == "config_key_ignored"]
    assert [e["key"] for e in ignored] == list(case.ignored)
    assert all(e["level"] == "warning" for e in ignored)
    for event in case.logged:
        assert [e["level"] for e in logged if e["event"] == event] == ["warning"], event


@pytest.mark.parametrize("case", CLI_REFUSED, ids=[c.name for c in CLI_REFUSED])
def test_agent_process_exits_2_with_one_line_naming_file_key_and_expectation(
    case: Case, plugin_dir: Path
) -> None:
    done = subprocess.run(
        agent_command(case, plugin_dir, case.node_file),
        capture_output=True,
        text=True,
        timeout=EXIT_WITHIN,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("node-agent: ")]
    assert len(errors) == 1, done.stderr
    assert errors[0].startswith(f"node-agent: {case.config}: {case.key}: "), errors[0]
    assert case.expected in errors[0]
    assert "Traceback" not in done.stderr
    assert list(plugin_dir.glob("*.sock")) == []
