"""The real NVML backend in a subprocess over a libnvidia-ml that tests control: the
project's own (tests/nvml, always) and, for a check by hand, NVIDIA's mock library where
MOCK_NVML_DIR names a directory holding it and MOCK_NVML_PROFILES (default: its profiles/)
the mock's own configuration for each profile (never in CI: another project's binary).

A `Lab` is one node for one test: its faults are set through `fail()` and reach the
library while the agent runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from agents.standin.kubelet import Kubelet
from tests.kubelet_dirs import private_kubelet_dirs
from tests.nvml import nodes, state
from tests.nvml.library import nvml_env
from tests.nvml.state import NvmlNode
from tests.timing import AGENT, SHORT_AGENT

MOCK_DIR = Path(os.environ["MOCK_NVML_DIR"]) if os.environ.get("MOCK_NVML_DIR") else None
MOCK_PROFILES = Path(os.environ.get("MOCK_NVML_PROFILES") or (MOCK_DIR or Path()) / "profiles")
# The libraries the suites run on: ours always; NVIDIA's mock only when asked for by hand.
LIBRARIES = ("own", "nvidia-mock") if MOCK_DIR is not None else ("own",)
PROFILES = nodes.PROFILES
NVSWITCH_PROFILES = frozenset({"a100", "gb200", "gb300", "h100"})
# Every node a real-backend suite runs on: each profile on each library, and the MIG
# layouts on ours (NVIDIA's mock models no MIG instances).
NODES = [(lib, p) for lib in LIBRARIES for p in PROFILES] + [("own", m) for m in nodes.MIG_LAYOUTS]
NODE_IDS = [f"{lib}-{node}" for lib, node in NODES]
MOCK_TTL_S = 0.1  # how often NVIDIA's mock re-reads its overrides file


class Lab:
    """One node on one library; `failing` maps NVML index -> fault mode."""

    def __init__(self, library: str, profile: str, tmp: Path, node: NvmlNode | None = None):
        self.library = library
        self.profile = profile
        self.node = node if node is not None else nodes.from_profile(profile)
        self.path = tmp / f"nvml-{library}.state"
        self.failing: dict[int, str] = {}
        self.apply()

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self.node.gpus]

    def env(self) -> dict[str, str]:
        if self.library == "own":
            return nvml_env(self.path)
        assert MOCK_DIR is not None
        return {
            **os.environ,
            "LD_LIBRARY_PATH": str(MOCK_DIR),
            "MOCK_NVML_CONFIG": str(MOCK_PROFILES / f"mock-nvml-config-{self.profile}.yaml"),
            "MOCK_NVML_OVERRIDES": str(self.path),
            "MOCK_NVML_OVERRIDES_TTL": f"{int(MOCK_TTL_S * 1000)}ms",
        }

    def fail(self, index: int, mode: str) -> None:
        """Fault GPU `index` as NVML shows it: fallen_off_bus (XID 79, then GPU_IS_LOST),
        lost (GPU_IS_LOST), ecc_uncorrectable (the uncorrected count grows); on our own
        library also NotSupported / NoPermission / Unknown answers and hang."""
        self.failing[index] = mode
        if self.library == "own":
            _own_fault(self.node, index, mode)
        self.apply()

    def reset(self, index: int) -> None:
        self.failing.pop(index, None)
        self.node.reset(index)
        self.apply()

    def apply(self) -> None:
        if self.library == "own":
            self.node.write(self.path)
            return
        devices: dict[str, object] = {}
        for index, mode in self.failing.items():
            failure: dict[str, object] = {"mode": mode}
            if mode == "fallen_off_bus":
                failure["xid"] = {"code": 79}
            devices[str(index)] = {"failure": failure}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(yaml.safe_dump({"devices": devices}))
        tmp.replace(self.path)


def lab_for(library: str, node: str, tmp: Path) -> Lab:
    """A Lab for a GPU profile or a MIG layout (nodes.MIG_LAYOUTS) by name."""
    if node in nodes.MIG_LAYOUTS:
        return Lab(library, nodes.MIG_LAYOUTS[node][0], tmp, nodes.with_mig(node))
    return Lab(library, node, tmp)


def _own_fault(node: NvmlNode, index: int, mode: str) -> None:
    gpu = node.gpus[index]
    if mode == "fallen_off_bus":
        node.fall_off_bus(index)
    elif mode == "lost":
        gpu.lost = True
    elif mode == "ecc_uncorrectable":
        node.ecc_uncorrectable(index)
    elif mode == "hang":
        gpu.hang_ms = state.HANG_FOREVER_MS
    elif mode in state.ERRORS:
        gpu.error = state.ERRORS[mode]
    else:
        raise ValueError(f"unknown fault mode {mode}")


@dataclass
class AgentProcess:
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

    def stop(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait(10)


def start_agent(
    lab: Lab, plugin_dir: Path, stderr_path: Path, *args: str, short_timing: bool = False
) -> AgentProcess:
    """`node-agent run --families gpu` on the real NVML backend over the lab's library; on
    tests/timing.py's short hold times and probe periods if asked; with DRA directories of
    its own (tests/kubelet_dirs.py)."""
    started = time.monotonic()
    run = ["run", "--families", "gpu", "--device-plugin-dir", str(plugin_dir), *args]
    with stderr_path.open("wb") as stderr:
        process = subprocess.Popen(
            [
                *(sys.executable, *(SHORT_AGENT if short_timing else AGENT)),
                *run,
                *private_kubelet_dirs(run, stderr_path.parent),
            ],
            env=lab.env(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )
    return AgentProcess(process, started, stderr_path)


def health(kubelet: Kubelet, resource: str = "nvidia.com/gpu") -> dict[str, str]:
    """Device ID -> health as the kubelet last heard it ({} while not connected)."""
    view = kubelet.resource(resource)
    if view is None or not view.connected:
        return {}
    return {i: s.health for i, s in view.devices.items()}


def unhealthy(kubelet: Kubelet, resource: str = "nvidia.com/gpu") -> set[str]:
    return {i for i, h in health(kubelet, resource).items() if h != "Healthy"}


def profile_numa(profile: str) -> dict[str, tuple[int, ...]]:
    """Per GPU UUID, the NUMA node this machine's sysfs has for the profile's PCI address:
    () where there is no such device here (neither library models sysfs)."""
    out: dict[str, tuple[int, ...]] = {}
    for gpu in nodes.from_profile(profile).gpus:
        domain, rest = gpu.bus.split(":", 1)
        numa_file = Path(f"/sys/bus/pci/devices/{int(domain, 16):04x}:{rest.lower()}/numa_node")
        numa = int(numa_file.read_text()) if numa_file.exists() else -1
        out[gpu.uuid] = (numa,) if numa >= 0 else ()
    return out
