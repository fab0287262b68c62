"""Shared fixtures: a device-plugin directory and the kubelet stand-in on it."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agents.standin.kubelet import Kubelet

# tests/e2e needs a real cluster (KUBECONFIG): hack/e2e runs it, on its own.
collect_ignore = [] if os.environ.get("NODE_AGENT_E2E") == "1" else ["e2e"]

# An agent the suite starts as a process never asks the host's own kubelet: a kubelet
# running on this machine (a lab) would answer pod-resources with pods of its own. A test
# that wants pod-resources passes --pod-resources-socket, which wins over this.
os.environ.setdefault("NODE_AGENT_POD_RESOURCES_SOCKET", "/nonexistent/pod-resources.sock")


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A fresh device-plugin directory with a short path: a unix socket path must fit
    in 108 bytes, which pytest's tmp_path with long test names does not leave room for."""
    path = Path(tempfile.mkdtemp(prefix="dp-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def kubelet(plugin_dir: Path) -> AsyncIterator[Kubelet]:
    """The kubelet stand-in on `plugin_dir`, started and stopped around the test."""
    kubelet = Kubelet(plugin_dir, seed=7)
    await kubelet.start()
    yield kubelet
    await kubelet.stop()
