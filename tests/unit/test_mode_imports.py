"""A mode loads only what it uses: device-plugin mode with the GPU family alone, started
as `node-agent run` starts it, loads neither DRA's wire (its gRPC stubs, its driver
server), nor, on a node where DRA never ran, its claims and checkpoints, nor the API
server's HTTP client, nor metrics, nor the RoCE family, nor the
netlink link monitor, nor hashlib (OpenSSL's libcrypto); they cost memory and start-up
time in every process that never uses them (docs/benchmarks.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# What `node-agent run --families gpu` (no --api, no kubeconfig, no metrics) goes through
# before it serves: the CLI, the daemon, the families' list, the GPU kind, the real
# backends, and the DRA checkpoints of an earlier DRA mode looked for and not found.
START = """
import asyncio, sys
from pathlib import Path
import agents.cli, agents.daemon
from agents.backends import real_backends
from agents.cluster import cluster_reporter
from agents.dra.holdings import DraHoldings
from agents.families import parse_families
from agents.kernel.kubelet_facts import PodResources

kinds = parse_families("gpu")
backends = real_backends()
root = Path(sys.argv[1])

async def start():
    assert await cluster_reporter(None, "n1", {}) is None
    holdings = DraHoldings(root / "plugins", root / "registry", root / "cdi", PodResources(None))
    await holdings.restore(["gpu.nvidia.com"])
    await holdings.run()  # nothing held: returns at once

asyncio.run(start())
print(" ".join(sorted(sys.modules)))
"""

NOT_IN_DEVICE_PLUGIN_MODE = (
    "httpx",
    "prometheus_client",
    "agents.api.dra_pb2",
    "agents.api.dra_v1beta1_pb2",
    "agents.api.dra_health_pb2",
    "agents.api.pluginregistration_pb2",
    "agents.dra.server",
    "agents.dra.driver",
    "agents.dra.claims",
    "agents.dra.claim_checkpoint",
    "agents.dra.cdi",
    "agents.cluster.client",
    "agents.metrics",
    "agents.exposition",
    "agents.roce.family",
    "agents.hw.netlink",
    "agents.hw.rtnetlink",
    "hashlib",
)


def _modules(code: str, *args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return set(done.stdout.split())


def test_gpu_device_plugin_mode_loads_no_dra_wire_http_metrics_or_roce(tmp_path: Path) -> None:
    loaded = _modules(START, str(tmp_path))
    assert "agents.gpu.family" in loaded  # the check ran the start-up it names
    assert sorted(loaded & set(NOT_IN_DEVICE_PLUGIN_MODE)) == []


def test_the_check_would_see_them_loaded() -> None:
    """Each module of the list exists and is found when a mode that uses it loads it."""
    code = (
        "import importlib, sys\n"
        f"for m in {NOT_IN_DEVICE_PLUGIN_MODE!r}: importlib.import_module(m)\n"
        "print(' '.join(sorted(sys.modules)))\n"
    )
    assert set(NOT_IN_DEVICE_PLUGIN_MODE) <= _modules(code)
