"""NVIDIA's mock libnvidia-ml (../shared/mocknvml beside the checkout): where it is, its
GPU profiles, and the agent run on it as a subprocess (pynvml loads the library once per
process, so each profile gets its own). Missing in CI (CI=true) is a failure."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
MOCK_DIR = Path(os.environ.get("MOCK_NVML_DIR", REPO.parent / "shared" / "mocknvml"))
LIBRARY = MOCK_DIR / "libnvidia-ml.so.1"
PROFILES = ("a100", "b200", "gb200", "gb300", "h100", "l40s", "t4")
NVSWITCH_PROFILES = frozenset({"a100", "gb200", "gb300", "h100"})
OVERRIDES_TTL_S = 0.1  # how often the mock re-reads its overrides file


def require_mock() -> None:
    """Skip where the mock library is absent; fail in CI, where it must be."""
    if LIBRARY.is_file():
        return
    message = f"mock NVML library not found at {LIBRARY} (set MOCK_NVML_DIR)"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def profile_path(profile: str) -> Path:
    return MOCK_DIR / "profiles" / f"mock-nvml-config-{profile}.yaml"


def profile_uuids(profile: str) -> list[str]:
    """The GPU UUIDs the profile declares, in NVML index order."""
    doc = yaml.safe_load(profile_path(profile).read_text())
    return [str(d["uuid"]) for d in doc["devices"]]


def profile_numa(profile: str) -> dict[str, tuple[int, ...]]:
    """Per GPU UUID, the NUMA node that this machine's sysfs has for the profile's PCI
    address: () where there is no such device here (the mock models none)."""
    doc = yaml.safe_load(profile_path(profile).read_text())
    out: dict[str, tuple[int, ...]] = {}
    for device in doc["devices"]:
        domain, rest = str(device["pci"]["bus_id"]).split(":", 1)
        numa_file = Path(f"/sys/bus/pci/devices/{int(domain, 16):04x}:{rest.lower()}/numa_node")
        numa = int(numa_file.read_text()) if numa_file.exists() else -1
        out[str(device["uuid"])] = (numa,) if numa >= 0 else ()
    return out


def mock_env(profile: str, overrides: Path) -> dict[str, str]:
    return {
        **os.environ,
        "LD_LIBRARY_PATH": str(MOCK_DIR),
        "MOCK_NVML_CONFIG": str(profile_path(profile)),
        "MOCK_NVML_OVERRIDES": str(overrides),
        "MOCK_NVML_OVERRIDES_TTL": f"{int(OVERRIDES_TTL_S * 1000)}ms",
    }


def write_overrides(path: Path, failures: dict[int, str]) -> None:
    """The mock's overrides file: NVML device index -> failure mode (XID 79 with
    fallen_off_bus, as the mock's README shows)."""
    devices: dict[str, object] = {}
    for index, mode in failures.items():
        failure: dict[str, object] = {"mode": mode}
        if mode == "fallen_off_bus":
            failure["xid"] = {"code": 79}
        devices[str(index)] = {"failure": failure}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(yaml.safe_dump({"devices": devices}))
    tmp.replace(path)


@dataclass
class MockAgent:
    process: subprocess.Popen[bytes]
    started: float
    stderr_path: Path

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def terminate(self, within: float) -> tuple[int, float]:
        """SIGTERM; (exit code, seconds it took)."""
        began = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(within)
        return code, time.monotonic() - began


def start_mock_agent(
    profile: str,
    plugin_dir: Path,
    overrides: Path,
    stderr_path: Path,
    *args: str,
    failing: dict[int, str] | None = None,
) -> MockAgent:
    """`node-agent run --families gpu` on the real NVML backend over the mock library,
    with the GPUs of `failing` (NVML index -> mode) failed before it starts."""
    write_overrides(overrides, failing or {})
    started = time.monotonic()
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [
                *(sys.executable, "-m", "agents.cli", "run", "--families", "gpu"),
                *("--device-plugin-dir", str(plugin_dir), *args),
            ],
            env=mock_env(profile, overrides),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    return MockAgent(process, started, stderr_path)
