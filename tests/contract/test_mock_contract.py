"""The NVML contract against the real backend on NVIDIA's mock libnvidia-ml, once per GPU
profile: each run is its own process, as pynvml loads the library once per process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.integration.mocknvml import PROFILES, REPO, mock_env, require_mock


@pytest.mark.parametrize("profile", PROFILES)
def test_real_backend_keeps_the_nvml_contract_on_mock_profile(
    profile: str,
) -> None:
    require_mock()
    env = mock_env(profile, REPO / "no-overrides.yaml")
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
