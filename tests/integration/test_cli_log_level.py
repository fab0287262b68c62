"""`--log-level` and NODE_AGENT_LOG_LEVEL through a real `node-agent run` process: the
flag wins over the variable, and no event below the level is logged."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conditions import PROCESS_WAIT as WAIT
from tests.conditions import async_wait_until
from tests.integration.conftest import AgentProcess

RANK = {"debug": 0, "info": 1, "warning": 2, "error": 3}


@pytest.mark.parametrize(
    "given",
    [(None, None, "info"), ("warning", "error", "warning"), (None, "error", "error")],
    ids=["default-info", "flag-wins-over-env", "env-alone"],
)
async def test_log_level_from_flag_or_env_drops_every_event_below_it(
    given: tuple[str | None, str | None, str],
    plugin_dir: Path,
    tmp_path: Path,
    start_agent: Callable[..., AgentProcess],
) -> None:
    flag, env, level = given  # --log-level, NODE_AGENT_LOG_LEVEL, the level in force
    config = tmp_path / "config.yaml"
    config.write_text("imex: {required: true}\n")  # ignored: one warning at start
    args = ["run", "--simulate", "h100-8gpu-8nic", "--families", "gpu", "--log-format", "json"]
    args += ["--device-plugin-dir", str(plugin_dir), "--config", str(config)]
    environ = {k: v for k, v in os.environ.items() if k != "NODE_AGENT_LOG_LEVEL"}
    agent = start_agent(
        [*args, *(["--log-level", flag] if flag else [])],
        env=environ | ({"NODE_AGENT_LOG_LEVEL": env} if env else {}),
    )
    await async_wait_until(lambda: list(plugin_dir.glob("node-agent-*.sock")), WAIT, "serving")
    # An error is logged at every level: once it is in, so is everything before it.
    config.write_text("flags: {migStrategy: sideways}\n")
    agent.process.send_signal(signal.SIGHUP)
    await async_wait_until(lambda: "config_reload_refused" in agent.stderr, WAIT, "refusal")
    assert agent.terminate() == 0, agent.stderr
    events = [json.loads(line) for line in agent.stderr.splitlines() if line.startswith("{")]
    assert all(RANK[e["level"]] >= RANK[level] for e in events), events
    names = {e["event"] for e in events}
    assert ("config_key_ignored" in names) == (RANK[level] <= RANK["warning"]), names
    assert ("agent_stopped" in names) == (RANK[level] <= RANK["info"]), names
