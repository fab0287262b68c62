"""The RPC and health path never loads the API client: a slow API server cannot reach
it, and the device plugins cost no memory for it when reports are off."""

from __future__ import annotations

import subprocess
import sys

RPC_PATH = [
    "agents.plugin.server",
    "agents.plugin.manager",
    "agents.gpu.family",
    "agents.roce.family",
    "agents.daemon",
    "agents.core.node_report",
]


def test_the_rpc_and_health_path_imports_no_cluster_module() -> None:
    code = (
        "import importlib, sys\n"
        f"for m in {RPC_PATH!r}: importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m.startswith('agents.cluster')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_the_check_would_see_a_cluster_import() -> None:
    code = "import agents.cluster, sys; print('agents.cluster.access' in sys.modules)"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "True"


def test_the_http_library_is_loaded_only_with_an_api_server_to_report_to() -> None:
    code = (
        "import asyncio, sys\n"
        "from agents.cluster import cluster_reporter\n"
        "off = asyncio.run(cluster_reporter(None, 'n1', {}))\n"
        "print(off is None, 'httpx' in sys.modules)\n"
        "from agents.cluster.access import Access\n"
        "from agents.cluster.client import ApiClient\n"
        "print('httpx' in sys.modules, end=' ')\n"
        "ApiClient(Access('http://127.0.0.1:1'))\n"
        "print('httpx' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    *_logged, off, on = done.stdout.splitlines()  # after the cluster_reports_off line
    # Loaded by the first client made, not by importing the module.
    assert (off, on) == ("True False", "False True")
