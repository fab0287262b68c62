"""Shared fixtures of the integration tests: a simulated node file, its edits, the agent
as a real `node-agent run` process that is always killed at the end, and the API-server
stand-in with a client of it."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.cluster.client import Access, ApiClient
from agents.sim.bundled import bundled_node
from tests.kubelet_dirs import private_kubelet_dirs
from tests.standin.apiserver import ApiServer
from tests.timing import AGENT, SHORT_AGENT
from tests.writers import write_atomic, write_in_place

NODE = "h100-8gpu-8nic"

NodeEdit = Callable[[dict[str, Any]], None]


@pytest.fixture
def node_file(tmp_path: Path) -> Path:
    """A private copy of the bundled 8-GPU, 8-NIC node, free to edit."""
    path = tmp_path / "node" / "node.yaml"
    path.parent.mkdir()
    shutil.copy(bundled_node(NODE), path)
    return path


@pytest.fixture
def node_doc(node_file: Path) -> dict[str, Any]:
    """The node file as first written, parsed."""
    doc: dict[str, Any] = yaml.safe_load(node_file.read_text())
    return doc


@pytest.fixture
def edit_node(node_file: Path) -> Callable[..., None]:
    """edit_node(change, atomic=True): apply `change` to the parsed file and write it back."""

    def edit(change: NodeEdit, *, atomic: bool = True) -> None:
        doc = yaml.safe_load(node_file.read_text())
        change(doc)
        text = yaml.safe_dump(doc, sort_keys=False)
        (write_atomic if atomic else write_in_place)(node_file, text)

    return edit


@dataclass
class AgentProcess:
    """One `node-agent` process; stderr goes to a file so that it can never block."""

    process: subprocess.Popen[bytes]
    started: float  # time.monotonic() just before the process was spawned
    stderr_path: Path

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def alive(self) -> bool:
        return self.process.poll() is None

    def terminate(self, within: float = 10.0) -> int:
        """SIGTERM, then the exit code (killed and failed if it does not exit in time)."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(within)


@pytest.fixture
def start_agent(tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    """start_agent(["run", ...], env=None, short_timing=False) spawns `python -m agents.cli
    ...` (in `env`, or this process's environment; on tests/timing.py's short hold times
    and probe periods if asked); stopped at teardown."""
    spawned: list[AgentProcess] = []

    def start(
        args: Sequence[str], env: Mapping[str, str] | None = None, short_timing: bool = False
    ) -> AgentProcess:
        args = [*args, *private_kubelet_dirs(args, tmp_path)]
        stderr_path = tmp_path / f"agent-{len(spawned)}.stderr"
        started = time.monotonic()
        with stderr_path.open("wb") as stderr:
            process = subprocess.Popen(
                [sys.executable, *(SHORT_AGENT if short_timing else AGENT), *args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                env=None if env is None else dict(env),
            )
        agent = AgentProcess(process, started, stderr_path)
        spawned.append(agent)
        return agent

    yield start
    for agent in spawned:  # stopped as a kubelet would: SIGTERM, then SIGKILL
        if agent.alive():  # (killed, it would leave its simulated tree in /dev/shm)
            agent.process.send_signal(signal.SIGTERM)
    for agent in spawned:
        try:
            agent.process.wait(10)
        except subprocess.TimeoutExpired:
            agent.process.kill()
            agent.process.wait(10)


@pytest.fixture
def api_nodes() -> tuple[str, ...]:
    """The Nodes the API-server stand-in holds from its start; a module may override it."""
    return ("node-1",)


@pytest.fixture
async def server(api_nodes: tuple[str, ...]) -> AsyncIterator[ApiServer]:
    """The API-server stand-in over plain http, stopped at the end."""
    server = ApiServer(api_nodes)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def client(server: ApiServer) -> AsyncIterator[ApiClient]:
    """A client of `server`; a request without an answer fails after a second."""
    async with ApiClient(Access(server.url), timeout_s=1.0) as client:
        yield client
