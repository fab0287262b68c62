"""SIGHUP re-reads the config file: a valid change re-registers only the resources
whose definition changed, an invalid one is logged in one line and the running config
stays. Signals go to a real `node-agent run` process; the kubelet is the stand-in."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agents.config import parse_config
from agents.standin.kubelet import Kubelet
from tests.conditions import WAIT, async_wait_until
from tests.integration.conftest import AgentProcess
from tests.integration.test_agent_lifecycle import GPU, NIC, listed, running

StartAgent = Callable[[Sequence[str]], AgentProcess]
STARTUP = 20.0  # a new Python process and its imports, on a loaded 2-core machine
SHARED = (
    "version: v1\nsharing:\n  timeSlicing:\n    resources:\n"
    "      - {{name: {name}, replicas: {n}}}\n"
)


def replicas(n: int, name: str = GPU) -> str:
    return SHARED.format(name=name, n=n)


def run_args(node_file: Path, plugin_dir: Path, config: Path) -> list[str]:
    return [
        *("run", "--simulate", str(node_file), "--device-plugin-dir", str(plugin_dir)),
        *("--config", str(config)),
    ]


def lines(agent: AgentProcess, event: str) -> list[str]:
    return [line for line in agent.stderr.splitlines() if event in line]


async def test_sighup_applies_a_valid_config_and_reregisters_only_the_changed_resource(
    node_file: Path, plugin_dir: Path, tmp_path: Path, kubelet: Kubelet, start_agent: StartAgent
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(replicas(2))
    agent = start_agent(run_args(node_file, plugin_dir, config))
    await kubelet.wait_until(lambda k: listed(GPU, 16)(k) and listed(NIC, 8)(k), STARTUP)
    before = len(kubelet.registrations)
    nic_endpoint, gpu_endpoint = kubelet.endpoint(NIC), kubelet.endpoint(GPU)

    config.write_text(replicas(4))
    agent.process.send_signal(signal.SIGHUP)

    await kubelet.wait_until(listed(GPU, 32), WAIT)
    await async_wait_until(lambda: lines(agent, "config_reloaded"), WAIT, "reload logged")
    assert [r.resource_name for r in kubelet.registrations[before:]] == [GPU]
    assert kubelet.endpoint(GPU) is not gpu_endpoint
    # The unchanged resource kept its endpoint and its one ListAndWatch stream.
    assert kubelet.endpoint(NIC) is nic_endpoint
    assert listed(NIC, 8)(kubelet)
    assert agent.alive()

    assert agent.terminate() == 0
    assert not any(p.name.startswith("node-agent-") for p in os.scandir(plugin_dir))


async def test_sighup_with_an_invalid_config_logs_one_line_and_keeps_serving(
    node_file: Path, plugin_dir: Path, tmp_path: Path, kubelet: Kubelet, start_agent: StartAgent
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(replicas(2))
    agent = start_agent(run_args(node_file, plugin_dir, config))
    await kubelet.wait_until(lambda k: listed(GPU, 16)(k) and listed(NIC, 8)(k), STARTUP)
    before = len(kubelet.registrations)
    endpoints = kubelet.endpoint(GPU), kubelet.endpoint(NIC)

    config.write_text(replicas(0))  # replicas < 1: a configuration error
    agent.process.send_signal(signal.SIGHUP)

    await async_wait_until(lambda: lines(agent, "config_reload_refused"), WAIT, "refusal logged")
    refused = lines(agent, "config_reload_refused")
    assert len(refused) == 1
    assert str(config) in refused[0] and "replicas" in refused[0]
    assert agent.alive()
    # A second, valid SIGHUP is still served: the first one changed nothing.
    config.write_text(replicas(2))
    agent.process.send_signal(signal.SIGHUP)
    await async_wait_until(lambda: lines(agent, "config_unchanged"), WAIT, "unchanged logged")
    assert len(kubelet.registrations) == before
    assert (kubelet.endpoint(GPU), kubelet.endpoint(NIC)) == endpoints
    assert listed(GPU, 16)(kubelet) and listed(NIC, 8)(kubelet)

    assert agent.terminate() == 0
    assert not any(p.name.startswith("node-agent-") for p in os.scandir(plugin_dir))


MIXED = "version: v1\nflags: {migStrategy: mixed}\n"
MIG = ("nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb")


def _mig_on_two_gpus(doc: dict[str, Any]) -> None:
    for i, profile in ((0, "1g.10gb"), (1, "3g.40gb")):
        doc["gpus"][i]["mig"] = {
            "enabled": True,
            "instances": [
                {"uuid": f"MIG-{i}{n}000000-0000-0000-0000-000000000000", "profile": profile}
                for n in range(2)
            ],
        }


async def test_reload_rebuilds_a_family_but_keeps_the_endpoints_of_unchanged_resources(
    node_file: Path, plugin_dir: Path, edit_node: Callable[..., None], kubelet: Kubelet
) -> None:
    edit_node(_mig_on_two_gpus)
    async with running(node_file, plugin_dir, parse_config(MIXED, "<test>")) as handle:
        await kubelet.wait_until(
            lambda k: listed(GPU, 6)(k) and all(listed(m, 2)(k) for m in MIG) and listed(NIC, 8)(k),
            WAIT,
        )
        before = len(kubelet.registrations)
        kept = {name: kubelet.endpoint(name) for name in (*MIG, NIC)}

        shared = MIXED + replicas(3).removeprefix("version: v1\n")
        await handle.agent.reload(parse_config(shared, "<test>"))

        await kubelet.wait_until(listed(GPU, 18), WAIT)
        assert [r.resource_name for r in kubelet.registrations[before:]] == [GPU]
        assert {name: kubelet.endpoint(name) for name in kept} == kept
        assert all(listed(name, 2)(kubelet) for name in MIG)


async def test_reload_withdraws_a_renamed_resource_and_registers_the_new_name(
    node_file: Path, plugin_dir: Path, kubelet: Kubelet
) -> None:
    async with running(node_file, plugin_dir) as handle:
        await kubelet.wait_until(lambda k: listed(GPU, 8)(k) and listed(NIC, 8)(k), WAIT)
        nic_endpoint = kubelet.endpoint(NIC)
        renamed = replicas(2) + "    renameByDefault: true\n"

        await handle.agent.reload(parse_config(renamed, "<test>"))

        await kubelet.wait_until(listed(f"{GPU}.shared", 16), WAIT)
        assert not (plugin_dir / "node-agent-nvidia.com-gpu.sock").exists()
        await kubelet.wait_until(lambda k: k.allocatable().get(GPU) == 0, WAIT)
        assert kubelet.endpoint(NIC) is nic_endpoint


async def test_reload_of_roce_selectors_reregisters_the_nics_whose_links_stay_watched(
    node_file: Path,
    plugin_dir: Path,
    node_doc: dict[str, Any],
    edit_node: Callable[..., None],
    kubelet: Kubelet,
) -> None:
    kept = node_doc["nics"][1]
    async with running(node_file, plugin_dir) as handle:
        await kubelet.wait_until(lambda k: listed(GPU, 8)(k) and listed(NIC, 8)(k), WAIT)
        gpu_endpoint = kubelet.endpoint(GPU)
        only_one = f"version: v1\nroce:\n  selectors: {{ifNames: [{kept['netdev']}]}}\n"

        await handle.agent.reload(parse_config(only_one, "<test>"))

        await kubelet.wait_until(listed(NIC, 1), WAIT)
        assert kubelet.endpoint(GPU) is gpu_endpoint
        # The replaced family's successor still hears of link changes.
        edit_node(lambda d: d["nics"][1].__setitem__("link", "down"))
        await kubelet.wait_until(listed(NIC, 1, healthy=0), WAIT)
