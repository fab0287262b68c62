"""A config per node (`run --config-dir`): a real `node-agent run` process on a simulated
node runs the named config its Node's label chooses, in the API-server stand-in, and
applies a new label value, a removed label or a ConfigMap update on the fly; a name that
names nothing, or an invalid config, keeps the running one. The kubelet is the stand-in."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from agents.standin.kubelet import Kubelet
from tests.conditions import async_wait_until
from tests.integration.conftest import AgentProcess
from tests.integration.test_agent_lifecycle import GPU, listed
from tests.integration.test_config_reload import lines, replicas
from tests.standin.apiserver import REFUSE, UP, ApiServer, write_kubeconfig

StartAgent = Callable[..., AgentProcess]
NODE = "gpu-node-1"
LABEL = "nvidia.com/device-plugin.config"
STARTUP = 20.0  # a new Python process and its imports, on a loaded 2-core machine
DEADLINE = 10.0  # a label change or a ConfigMap update applied within this


@pytest.fixture
def api_nodes() -> tuple[str, ...]:
    return (NODE,)


def configmap(directory: Path, configs: dict[str, str]) -> Path:
    """`directory` as the kubelet mounts a ConfigMap with these keys: the files in a
    timestamped directory, `..data` linking to it, and a link per key through `..data`;
    called again, it swaps `..data` to a new directory atomically, as an update does."""
    directory.mkdir(exist_ok=True)
    data = directory / "..data"
    old = data.resolve() if data.is_symlink() else None
    fresh = directory / f"..2025_01_01_{time.monotonic_ns()}"
    fresh.mkdir()
    for key, text in configs.items():
        (fresh / key).write_text(text)
    (directory / "..data_tmp").symlink_to(fresh.name)
    (directory / "..data_tmp").rename(data)
    for key in configs:
        link = directory / key
        if not link.is_symlink():
            link.symlink_to(f"..data/{key}")
    for link in directory.iterdir():
        if link.is_symlink() and link.name not in configs and not link.name.startswith("."):
            link.unlink()
    if old is not None:
        shutil.rmtree(old)
    return directory


def agent_args(
    node_file: Path, plugin_dir: Path, configs: Path, server: ApiServer | None
) -> list[str]:
    args = [
        *("run", "--simulate", str(node_file), "--families", "gpu"),
        *("--device-plugin-dir", str(plugin_dir)),
        *("--config-dir", str(configs), "--config-default", "default"),
    ]
    if server is not None:
        kubeconfig = write_kubeconfig(configs.parent / "kubeconfig", server.url)
        args += ["--kubeconfig", str(kubeconfig), "--node-name", NODE]
    return args


def env_without_node_name() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "NODE_NAME"}


def start(start_agent: StartAgent, args: Sequence[str]) -> AgentProcess:
    return start_agent(args, env=env_without_node_name())


CONFIGS = {"default": replicas(1), "ts4": replicas(4), "ts2.yaml": replicas(2)}
Launch = Callable[..., tuple[AgentProcess, Path]]


@pytest.fixture
def launch(
    node_file: Path, plugin_dir: Path, tmp_path: Path, server: ApiServer, start_agent: StartAgent
) -> Launch:
    """launch(configs, label=None, api=True): the ConfigMap mounted, the Node labelled,
    and the agent started on them; (the agent, the config directory)."""

    def run(
        configs: dict[str, str], label: str | None = None, api: bool = True
    ) -> tuple[AgentProcess, Path]:
        directory = configmap(tmp_path / "configs", configs)
        server.store.label_node(NODE, LABEL, label)
        args = agent_args(node_file, plugin_dir, directory, server if api else None)
        return start(start_agent, args), directory

    return run


async def test_the_label_chooses_the_config_and_a_new_value_reregisters_with_the_other_one(
    launch: Launch, kubelet: Kubelet, server: ApiServer
) -> None:
    agent, configs = launch(CONFIGS, "ts4")
    await kubelet.wait_until(listed(GPU, 32), STARTUP)
    assert lines(agent, "config_chosen") and "ts4" in lines(agent, "config_chosen")[0]
    before = len(kubelet.registrations)

    server.store.label_node(NODE, LABEL, "ts2")  # the file is ts2.yaml

    await kubelet.wait_until(listed(GPU, 16), DEADLINE)
    assert [r.resource_name for r in kubelet.registrations[before:]] == [GPU]
    await async_wait_until(lambda: lines(agent, "config_reloaded"), DEADLINE, "reload logged")
    assert str(configs / "ts2.yaml") in lines(agent, "config_reloaded")[0]
    assert agent.terminate() == 0


async def test_a_removed_label_brings_the_default_back_and_an_unknown_name_keeps_the_config(
    launch: Launch, kubelet: Kubelet, server: ApiServer
) -> None:
    agent, configs = launch(CONFIGS, "ts4")
    await kubelet.wait_until(listed(GPU, 32), STARTUP)

    server.store.label_node(NODE, LABEL, None)
    await kubelet.wait_until(listed(GPU, 8), DEADLINE)
    server.store.label_node(NODE, LABEL, "ts4")
    await kubelet.wait_until(listed(GPU, 32), DEADLINE)
    before = len(kubelet.registrations)

    server.store.label_node(NODE, LABEL, "ts8")
    await async_wait_until(lambda: lines(agent, "config_label_unknown"), DEADLINE, "unknown")
    [unknown] = lines(agent, "config_label_unknown")
    assert "ts8" in unknown and "['default', 'ts2', 'ts4']" in unknown and "kept=ts4" in unknown
    assert len(kubelet.registrations) == before and listed(GPU, 32)(kubelet)
    assert agent.alive()

    # The name it asks for appears in a ConfigMap update: it is applied then.
    configmap(configs, {**CONFIGS, "ts8": replicas(8)})
    await kubelet.wait_until(listed(GPU, 64), DEADLINE)
    assert len(lines(agent, "config_label_unknown")) == 1
    assert agent.terminate() == 0


async def test_a_configmap_update_that_swaps_the_data_link_is_applied_on_the_fly(
    launch: Launch, kubelet: Kubelet, server: ApiServer
) -> None:
    agent, configs = launch(CONFIGS, "ts4")
    await kubelet.wait_until(listed(GPU, 32), STARTUP)
    before = len(kubelet.registrations)

    configmap(configs, {**CONFIGS, "ts4": replicas(3)})

    await kubelet.wait_until(listed(GPU, 24), DEADLINE)
    assert [r.resource_name for r in kubelet.registrations[before:]] == [GPU]
    # An update of other configs only registers nothing again; the next one of ts4 does.
    configmap(configs, {**CONFIGS, "ts4": replicas(3), "default": replicas(2)})
    configmap(configs, {**CONFIGS, "ts4": replicas(5), "default": replicas(2)})
    await kubelet.wait_until(listed(GPU, 40), DEADLINE)
    assert [r.resource_name for r in kubelet.registrations[before:]] == [GPU, GPU]
    assert agent.terminate() == 0


async def test_an_invalid_named_config_is_refused_in_one_line_and_the_running_one_stays(
    launch: Launch, kubelet: Kubelet, server: ApiServer
) -> None:
    agent, configs = launch({**CONFIGS, "bad": replicas(0)}, "ts4")
    await kubelet.wait_until(listed(GPU, 32), STARTUP)
    before = len(kubelet.registrations)

    server.store.label_node(NODE, LABEL, "bad")

    await async_wait_until(lambda: lines(agent, "config_reload_refused"), DEADLINE, "refused")
    [refused] = lines(agent, "config_reload_refused")
    assert str(configs / "bad") in refused and "replicas" in refused
    assert str(configs / "ts4") in refused  # what was kept
    # An update that leaves the bad config as it is says nothing more.
    configmap(configs, {**CONFIGS, "bad": replicas(0), "other": replicas(2)})
    server.store.label_node(NODE, LABEL, "ts2")
    await kubelet.wait_until(listed(GPU, 16), DEADLINE)
    assert len(lines(agent, "config_reload_refused")) == 1
    assert len(kubelet.registrations) == before + 1
    assert agent.alive()
    assert agent.terminate() == 0


async def test_without_api_access_the_default_runs_and_follows_its_file_and_sighup(
    launch: Launch, kubelet: Kubelet
) -> None:
    agent, configs = launch(CONFIGS, api=False)
    await kubelet.wait_until(listed(GPU, 8), STARTUP)
    assert len(lines(agent, "config_label_off")) == 1

    configmap(configs, {**CONFIGS, "default": replicas(2)})

    await kubelet.wait_until(listed(GPU, 16), DEADLINE)
    # SIGHUP reads the chosen config again: the same, so nothing registers again.
    before = len(kubelet.registrations)
    agent.process.send_signal(signal.SIGHUP)
    await async_wait_until(lambda: lines(agent, "config_unchanged"), DEADLINE, "unchanged")
    assert str(configs / "default") in lines(agent, "config_unchanged")[0]
    assert len(kubelet.registrations) == before
    # The default taken out of the ConfigMap: said once, and the running config stays.
    configmap(configs, {"ts4": replicas(4)})
    await async_wait_until(lambda: lines(agent, "config_default_missing"), DEADLINE, "missing")
    assert "available=['ts4']" in lines(agent, "config_default_missing")[0]
    assert len(kubelet.registrations) == before and listed(GPU, 16)(kubelet)
    assert agent.terminate() == 0


async def test_an_api_server_away_at_start_gives_the_default_then_the_label_once_back(
    launch: Launch, kubelet: Kubelet, server: ApiServer
) -> None:
    await server.set_mode(REFUSE)
    agent, _ = launch(CONFIGS, "ts4")
    await kubelet.wait_until(listed(GPU, 8), STARTUP)
    assert len(lines(agent, "config_label_unread")) == 1

    await server.set_mode(UP)
    await kubelet.wait_until(listed(GPU, 32), DEADLINE + 30.0)  # the backoff reaches 30 s

    # The watch is lost and opened again: a later change still arrives.
    await server.set_mode(REFUSE)
    await server.set_mode(UP)
    server.store.label_node(NODE, LABEL, "ts2")
    await kubelet.wait_until(listed(GPU, 16), DEADLINE + 30.0)
    assert agent.terminate() == 0
