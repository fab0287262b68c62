"""The NVML contract against the real backend over an NVML library, once per GPU profile
and MIG layout: each run is its own process, as pynvml loads the library once per process.
The library is the project's own (tests/nvml), and NVIDIA's mock as well where
MOCK_NVML_DIR is given by hand (it models no MIG instances)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.nvml.harness import NODE_IDS, NODES, lab_for
from tests.nvml.nodes import REPO


@pytest.mark.parametrize(("library", "node"), NODES, ids=NODE_IDS)
def test_real_backend_keeps_the_nvml_contract(library: str, node: str, tmp_path: Path) -> None:
    env = lab_for(library, node, tmp_path).env()
    env["NVML_CONTRACT_REQUIRED"] = "1"
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
            *("-k", "real", "tests/contract/test_nvml_contract.py"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    tail = done.stdout[-3000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert " skipped" not in done.stdout, tail
