"""Compute modes read and set alike by the simulator and by the real backend over the test
NVML library, for the same node: as set, DEFAULT before, a refused mode, and NVML's
answer to a caller that is not root."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agents.errors import BackendError
from agents.hw.nvml import Nvml
from agents.sim.bundled import bundled_node
from agents.sim.node import load_node
from agents.sim.nvml import SimNvml
from tests.nvml.library import nvml_env
from tests.nvml.nodes import REPO, from_sim_node

NO_PERMISSION = 4  # NVML_ERROR_NO_PERMISSION
NODE = load_node(bundled_node("h100-8gpu-8nic"))
STEPS = [  # (GPU index, mode to set); each is followed by a read of every GPU
    (0, "EXCLUSIVE_PROCESS"),
    (1, "EXCLUSIVE_PROCESS"),
    (0, "DEFAULT"),
    (2, "PROHIBITED"),
    (3, "EXCLUSIVE_THREAD"),  # no longer supported: refused
]

REAL = """
import json, sys
from agents.hw.nvml_backend import NvmlBackend
from tests.contract.test_compute_mode_contract import answers
nvml = NvmlBackend()
nvml.init()
print(json.dumps(answers(nvml)))
"""


def answers(nvml: Nvml) -> list[object]:
    """Every GPU's mode, then after each step what the set said and every GPU's mode."""
    uuids = [g.uuid for g in nvml.gpus()]
    out: list[object] = [[nvml.compute_mode(u) for u in uuids]]
    for index, mode in STEPS:
        try:
            nvml.set_compute_mode(uuids[index], mode)
            said = "ok"
        except BackendError as exc:
            said = str(exc)
        out.append([said, [nvml.compute_mode(u) for u in uuids]])
    return out


def real_answers(tmp_path: Path, *, privileged: bool) -> list[object]:
    state = from_sim_node(NODE)
    if not privileged:
        for gpu in state.gpus:
            gpu.fails["nvmlDeviceSetComputeMode"] = NO_PERMISSION
    state.write(tmp_path / "state")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(REAL)],
        cwd=REPO,
        env=nvml_env(tmp_path / "state"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: list[object] = json.loads(done.stdout)
    return result


@pytest.mark.parametrize("privileged", [True, False], ids=["root", "not-root"])
def test_real_and_simulated_backends_read_and_set_compute_modes_alike(
    tmp_path: Path, privileged: bool
) -> None:
    nvml = SimNvml(NODE, privileged=privileged)
    nvml.init()
    simulated = answers(nvml)
    assert simulated == real_answers(tmp_path, privileged=privileged)
    assert simulated[0] == ["DEFAULT"] * 8
    final = simulated[-1]
    assert isinstance(final, list)
    if privileged:
        assert final[1][:4] == ["DEFAULT", "EXCLUSIVE_PROCESS", "PROHIBITED", "DEFAULT"]
        assert "no mode 'EXCLUSIVE_THREAD'" in final[0]
    else:
        assert all("Insufficient Permissions" in step[0] for step in simulated[1:5])  # type: ignore[index]
        assert final[1] == ["DEFAULT"] * 8
