"""`node-agent run --kubeconfig FILE --node-name NAME` end to end: a real process on a
simulated node tells the API-server stand-in of a fault; without a node name or an API
server it says so in one line and serves."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.conditions import PROCESS_WAIT as WAIT
from tests.conditions import async_wait_until
from tests.integration.conftest import AgentProcess
from tests.standin.apiserver import REFUSE, ApiServer, write_kubeconfig

NODE = "sim-node-1"


@pytest.fixture
def api_nodes() -> tuple[str, ...]:
    return (NODE,)


def args(node_file: Path, *more: str) -> list[str]:
    plugin_dir = tempfile.mkdtemp(prefix="dp-")
    return [
        "run",
        "--simulate",
        str(node_file),
        "--families",
        "gpu",
        "--device-plugin-dir",
        plugin_dir,
        *more,
    ]


async def test_xid_through_the_cli_reaches_the_api_server(
    server: ApiServer,
    node_file: Path,
    node_doc: dict[str, Any],
    edit_node: Callable[..., None],
    start_agent: Callable[[Sequence[str]], AgentProcess],
) -> None:
    config = write_kubeconfig(node_file.parent / "kubeconfig", server.url)
    agent = start_agent(args(node_file, "--kubeconfig", str(config), "--node-name", NODE))

    def condition() -> dict[str, Any]:
        return server.store.condition(NODE, "DevicesHealthy") or {}

    await async_wait_until(lambda: condition().get("status") == "True", WAIT)
    victim = node_doc["gpus"][1]["uuid"]
    edit_node(lambda doc: doc["gpus"][1].update(xids=[79]))
    await async_wait_until(lambda: condition().get("status") == "False", WAIT)
    # The condition is patched first, the Event posted right after.
    await async_wait_until(lambda: server.store.event_list("default")["items"] != [], WAIT)
    [event] = server.store.event_list("default")["items"]
    assert f"{victim} (GPU 1) is Unhealthy: XID 79 (fell off the bus)" in event["message"]
    assert agent.terminate() == 0


async def test_without_a_node_name_one_line_says_so_and_the_agent_serves(
    node_file: Path, start_agent: Callable[[Sequence[str]], AgentProcess], tmp_path: Path
) -> None:
    env_name = os.environ.pop("NODE_NAME", None)
    try:
        agent = start_agent(args(node_file, "--kubeconfig", str(tmp_path / "absent")))
        await async_wait_until(lambda: "agent_started" in agent.stderr, WAIT)
    finally:
        if env_name is not None:
            os.environ["NODE_NAME"] = env_name
    assert agent.stderr.count("cluster_reports_off") == 1
    assert "no node name" in agent.stderr
    assert agent.terminate() == 0


async def test_a_refusing_api_server_is_one_log_line_while_the_agent_serves(
    server: ApiServer,
    node_file: Path,
    start_agent: Callable[[Sequence[str]], AgentProcess],
    tmp_path: Path,
) -> None:
    await server.set_mode(REFUSE)
    config = write_kubeconfig(tmp_path / "kubeconfig", server.url)
    agent = start_agent(args(node_file, "--kubeconfig", str(config), "--node-name", NODE))
    await async_wait_until(lambda: "cluster_unreachable" in agent.stderr, WAIT)
    await async_wait_until(lambda: "agent_started" in agent.stderr, WAIT)
    assert agent.alive()
    assert agent.stderr.count("cluster_unreachable") == 1
    assert agent.terminate() == 0
