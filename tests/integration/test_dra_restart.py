"""DRA mode through the restarts device-plugin mode survives: the kubelet's (its plugin
watcher anew on the same directory), our sockets removed by someone, the API server down
while the agent runs (prepare fails per claim, in time, other calls answer, slices catch
up), and a SIGHUP config reload (a key DRA ignores, a malformed file)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agents.dra.wiring import CLAIM_DEADLINE_S
from tests.conditions import PROCESS_WAIT as WAIT
from tests.integration.conftest import AgentProcess
from tests.integration.dra_node import GPU, NIC, DraNode, dra_node, ref
from tests.standin.apiserver import HANG, REFUSE, UP

__all__ = ["dra_node"]

SLICE_WRITES = ("create", "update", "delete")


def slice_writes(node: DraNode) -> int:
    return sum(node.server.count(verb, "resourceslices") for verb in SLICE_WRITES)


async def prepared(node: DraNode, uid: str, driver: str = GPU) -> str:
    """The error of preparing claim `uid` ("" when prepared)."""
    answer = await node.kubelet.prepare(driver, [ref(uid)])
    return str(answer.claims[uid].error)


async def test_after_a_kubelet_restart_both_drivers_register_again_and_prepare_works(
    dra_node: DraNode, node_file: Path
) -> None:
    await dra_node.start(node_file)
    dra_node.claim("before", [("gpu", GPU, "gpu-0")])
    assert await prepared(dra_node, "before") == ""

    await dra_node.restart_kubelet()
    for driver in (GPU, NIC):
        await dra_node.watcher.registered(driver, WAIT)
    assert await prepared(dra_node, "before") == ""  # idempotent across the restart
    dra_node.claim("after", [("gpu", GPU, "gpu-1")])
    assert await prepared(dra_node, "after") == ""
    nic = sorted(dra_node.devices(NIC))[0]
    dra_node.claim("nic", [("nic", NIC, nic)])
    assert await prepared(dra_node, "nic", NIC) == ""


async def test_sockets_someone_removed_are_served_again_and_registered_anew(
    dra_node: DraNode, node_file: Path
) -> None:
    agent = await dra_node.start(node_file)
    old = {d: dra_node.watcher.drivers[d] for d in (GPU, NIC)}
    for registration in old.values():
        os.unlink(registration.endpoint)
        os.unlink(registration.socket)
    for driver, registration in old.items():
        await dra_node.watcher.registered(driver, WAIT, after=registration.serial)
    assert agent.stderr.count("dra_socket_removed") == 2
    dra_node.claim("c", [("gpu", GPU, "gpu-0")])
    assert await prepared(dra_node, "c") == ""
    # The new service socket serves the health stream too.
    stream = dra_node.kubelet.watch_health(GPU)
    first = await anext(stream)
    await stream.aclose()
    assert {d.device.device_name for d in first.devices} == set(dra_node.devices(GPU))
    assert agent.alive()


async def test_with_the_api_server_down_prepare_fails_per_claim_in_time_and_slices_catch_up(
    dra_node: DraNode, node_file: Path, edit_node: Callable[..., None]
) -> None:
    await dra_node.start(node_file)
    dra_node.claim("kept", [("gpu", GPU, "gpu-0")])
    assert await prepared(dra_node, "kept") == ""
    dra_node.claim("new", [("gpu", GPU, "gpu-1")])
    await dra_node.server.set_mode(REFUSE)  # gone: the claim's read fails at once
    error = await prepared(dra_node, "new")
    assert "API server unreachable" in error and "c-new" in error
    await dra_node.server.set_mode(HANG)  # accepts, never answers: the deadline counts

    began = time.monotonic()
    pending = asyncio.ensure_future(dra_node.kubelet.prepare(GPU, [ref("new")]))
    # While that claim's read waits on the API server, other calls answer.
    assert await prepared(dra_node, "kept") == ""
    done = await dra_node.kubelet.unprepare(GPU, [ref("kept")])
    assert done.claims["kept"].error == ""
    assert not pending.done()
    error = (await pending).claims["new"].error
    took = time.monotonic() - began
    print(f"API server hanging -> per-claim error after {took:.1f} s: {error}")
    assert "API server" in error and "c-new" in error
    assert took < CLAIM_DEADLINE_S + 1.0

    edit_node(lambda d: d["gpus"][2]["xids"].append(79))  # unpublishable for now
    await dra_node.server.set_mode(UP)
    await dra_node.wait(lambda: "gpu-2" not in dra_node.devices(GPU))
    assert await prepared(dra_node, "new") == ""


def _reloaded(agent: AgentProcess, event: str, count: int) -> Callable[[], bool]:
    return lambda: agent.stderr.count(event) >= count or not agent.alive()


@pytest.mark.parametrize(
    "ignored",
    [
        ("flags:\n  migStrategy: single\n", "migStrategy"),
        ("roce:\n  resourceName: rdma/other\n", "roce.resourceName"),
    ],
    ids=["gpu-key", "roce-key"],
)
async def test_sighup_applies_a_key_dra_ignores_without_publishing_and_refuses_a_bad_file(
    dra_node: DraNode,
    node_file: Path,
    edit_node: Callable[..., None],
    tmp_path: Path,
    ignored: tuple[str, str],  # (the config's lines, the key DRA ignores)
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("version: v1\n")
    agent = await dra_node.start(node_file, "--config", str(config))
    dra_node.claim("c", [("gpu", GPU, "gpu-0")])
    assert await prepared(dra_node, "c") == ""
    writes = slice_writes(dra_node)

    lines, key = ignored
    config.write_text(f"version: v1\n{lines}")
    agent.process.send_signal(signal.SIGHUP)
    await dra_node.wait(_reloaded(agent, "config_reloaded", 1))
    assert agent.alive(), agent.stderr[-3000:]
    assert agent.stderr.count("dra_ignores_key") == 1
    assert f"key={key}" in agent.stderr

    config.write_text("version: v1\nflags:\n  migStrategy: sideways\n")
    agent.process.send_signal(signal.SIGHUP)
    await dra_node.wait(_reloaded(agent, "config_reload_refused", 1))
    assert agent.alive(), agent.stderr[-3000:]
    [refusal] = [line for line in agent.stderr.splitlines() if "config_reload_refused" in line]
    assert "migStrategy" in refusal

    # A change of health after both reloads is published as one write: neither reload
    # wrote a slice, and the prepared claim is still known.
    edit_node(lambda d: d["gpus"][5]["xids"].append(79))
    await dra_node.wait(lambda: "gpu-5" not in dra_node.devices(GPU))
    assert slice_writes(dra_node) == writes + 1
    assert len(dra_node.devices(GPU)) == 7
    assert await prepared(dra_node, "c") == ""
    dra_node.claim("thief", [("gpu", GPU, "gpu-0")])
    assert "c-c" in await prepared(dra_node, "thief")
