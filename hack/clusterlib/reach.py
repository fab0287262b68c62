"""The cluster the lab scripts run against: the one KUBECONFIG names, once it answers;
else the script stops with one line saying what to set (docs/testing.md)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

HOW = "docs/testing.md, 'The lab: a real single-node cluster'"


def kubectl() -> str:
    """kubectl's path; exit with one line when it is not in PATH."""
    found = shutil.which("kubectl")
    if found is None:
        sys.exit(f"{_tool()}: kubectl is not in PATH ({HOW})")
    return found


def kubeconfig() -> Path:
    """The file KUBECONFIG names, once its cluster answers `kubectl get --raw /readyz`;
    exit with one line naming KUBECONFIG when it is unset or the cluster does not answer."""
    named = os.environ.get("KUBECONFIG", "")
    if not named:
        sys.exit(f"{_tool()}: set KUBECONFIG to a cluster this machine reaches ({HOW})")
    try:
        done = subprocess.run(
            [kubectl(), "--request-timeout=10s", "get", "--raw", "/readyz"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired:
        sys.exit(f"{_tool()}: KUBECONFIG={named}: the cluster did not answer within 30 s")
    if done.returncode:
        why = (done.stderr.strip().splitlines() or ["no answer"])[-1]
        sys.exit(f"{_tool()}: KUBECONFIG={named}: the cluster does not answer: {why}")
    return Path(named.split(os.pathsep)[0])


def _tool() -> str:
    return f"hack/{Path(sys.argv[0]).name}"
