"""`node-agent topo` closes what it opens, on success and on error: no descriptor is left
open or left to the garbage collector, a simulated node's tree is removed, NVML is shut
down. Each run is a fresh process (tests.integration.topo_probe) that reports this."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.sim.bundled import bundled_node
from tests.nvml.harness import Lab
from tests.nvml.library import nvml_env
from tests.nvml.nodes import REPO


def probe(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.topo_probe", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def assert_nothing_left(result: dict[str, Any]) -> None:
    assert result["fds_left"] == []
    assert result["unclosed"] == []
    assert result["roots_left"] == []


def test_simulated_topo_removes_its_tree_and_closes_its_sockets() -> None:
    result = probe(str(bundled_node("all-distances")))
    assert result["error"] is None
    assert len(result["roots_made"]) == 1
    assert_nothing_left(result)


def test_simulated_topo_on_a_malformed_node_file_removes_its_tree(tmp_path: Path) -> None:
    node_file = tmp_path / "node.yaml"
    node_file.write_text("gpus: [1\n")
    result = probe(str(node_file))
    assert result["error"] == "ConfigError"
    assert len(result["roots_made"]) == 1
    assert_nothing_left(result)


@pytest.mark.parametrize("fault", [None, "GpuIsLost"], ids=["healthy", "gpu-lost"])
def test_topo_on_a_real_node_shuts_nvml_down_and_opens_no_socket(
    tmp_path: Path, fault: str | None
) -> None:
    lab = Lab("own", "h100", tmp_path)
    if fault is not None:
        lab.fail(0, fault)
    result = probe(env=lab.env())
    assert result["error"] is None
    assert result["nvml_initialised"] is False
    assert_nothing_left(result)


def test_topo_without_nvml_fails_and_leaves_nothing_open(tmp_path: Path) -> None:
    result = probe(env=nvml_env(tmp_path / "absent.state"))
    assert result["error"] == "BackendError"
    assert result["nvml_initialised"] is False
    assert_nothing_left(result)
