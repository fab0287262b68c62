"""RPC latency while one GPU's NVML calls hang (simulated `nvml: {hang: 30}`) against an
idle agent, how long the hung GPU takes to turn Unhealthy, and how long SIGTERM takes
meanwhile. Two agents on copies of one node, called in turn, so that both see the same
machine: the comparison holds on a busy one too."""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import yaml

from agents.hw.nvml_calls import HANG_S
from agents.sim.bundled import DEMO_NODE, bundled_node
from hack.benchlib.agent import GPU, NIC, AgentProcess, Client, Watcher, percentile
from hack.benchlib.figures import Figure, below, info
from hack.benchlib.nodes import write_yaml

HANG_FOR_S = 30
VICTIM = 3
SIGTERM_WITHIN_S = 2.0
Calls = dict[str, list[Callable[[], object]]]


def _calls(clients: dict[str, Client], healthy: dict[str, list[str]], n: int) -> Calls:
    rng = random.Random(n)
    out: Calls = {}
    for resource, client in clients.items():
        ids = healthy[resource]
        out[f"GetDevicePluginOptions {resource}"] = [client.options] * n
        out[f"Allocate {resource}"] = [
            partial(client.allocate, rng.sample(ids, rng.randint(1, 2))) for _ in range(n)
        ]
        out[f"GetPreferredAllocation {resource}"] = [
            partial(client.preferred, ids, [], rng.randint(1, 4)) for _ in range(n)
        ]
    return out


def _interleaved_p99s(idle: Calls, hung: Calls) -> dict[str, tuple[float, float]]:
    """Per RPC, (idle p99, hung p99) in ms, the two agents called in turn."""
    # Each sample pair shares the machine's state of the moment: load from elsewhere
    # lands on both sides alike.
    out: dict[str, tuple[float, float]] = {}
    for name, idle_calls in idle.items():
        ms: tuple[list[float], list[float]] = ([], [])
        for i, pair in enumerate(zip(idle_calls, hung[name], strict=True)):
            turns = list(zip(ms, pair, strict=True))
            for samples, call in turns if i % 2 else reversed(turns):  # neither always first
                started = time.perf_counter()
                call()
                samples.append((time.perf_counter() - started) * 1000)
        out[name] = (percentile(ms[0], 99), percentile(ms[1], 99))
    return out


def _wait_logged(agent: AgentProcess, event: str, deadline: float) -> None:
    """Until the agent's log shows `event`: the hang is in effect, the edit applied."""
    while event not in (agent.work / "agent.log").read_text():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the agent never logged {event}")
        time.sleep(0.01)  # polling a log file, with a deadline


def _agent(work: Path) -> tuple[AgentProcess, dict[str, Any]]:
    work.mkdir()
    node_file = work / "node.yaml"
    shutil.copy(bundled_node(DEMO_NODE), node_file)
    return AgentProcess(work, node_file), yaml.safe_load(node_file.read_text())


def nvml_hang(work: Path, n: int) -> list[Figure]:
    (idle, _), (hung, doc) = _agent(work / "idle"), _agent(work / "hung")
    victim = doc["gpus"][VICTIM]["uuid"]
    figures: list[Figure] = []
    try:
        for agent in (idle, hung):
            agent.start()
        for agent in (idle, hung):
            agent.wait_serving([GPU, NIC])
        clients = [{r: Client(a.socket(r)) for r in (GPU, NIC)} for a in (idle, hung)]
        healthy = {r: sorted(i for i in c.devices() if i != victim) for r, c in clients[0].items()}
        watcher = Watcher(hung.socket(GPU))
        try:
            _interleaved_p99s(_calls(clients[0], healthy, 20), _calls(clients[1], healthy, 20))
            doc["gpus"][VICTIM]["nvml"] = {"hang": HANG_FOR_S}
            hung_at = time.monotonic()
            write_yaml(hung.node_file, doc)
            _wait_logged(hung, "nvml_call_slow", hung_at + HANG_FOR_S / 3)
            _wait_logged(hung, "nvml_event_wait_slow", hung_at + HANG_FOR_S / 3)
            p99s = _interleaved_p99s(_calls(clients[0], healthy, n), _calls(clients[1], healthy, n))
            measured_by = time.monotonic() - hung_at
            unhealthy_at = watcher.wait_for(lambda h: h.get(victim) == "Unhealthy", HANG_S + 10)
        finally:
            watcher.close()
            for side in clients:
                for client in side.values():
                    client.channel.close()
        note = f"{n} calls each, in turn with an idle agent; GPU {VICTIM} hangs {HANG_FOR_S} s"
        for name, (idle_p99, hung_p99) in p99s.items():
            figures.append(info(f"{name} p99 idle", idle_p99, "ms"))
            figures.append(below(f"{name} p99 NVML hung", hung_p99, "ms", 2 * idle_p99, note))
        figures.append(info("hung calls measured by", measured_by, "s", "after the edit"))
        figures.append(
            below(
                "hung GPU -> Unhealthy",
                unhealthy_at - hung_at,
                "s",
                HANG_S + 2,
                f"hang bound {HANG_S:g} s",
            )
        )
        began = time.monotonic()
        code = hung.stop(within=10)
        took = time.monotonic() - began
        note = f"exit code {code}; a status call and the event wait hang"
        figures.append(below("SIGTERM -> exit, NVML hung", took, "s", SIGTERM_WITHIN_S, note))
    finally:
        idle.stop()
        hung.stop()
    return figures
