"""Fault -> Unhealthy as a ListAndWatch client sees it: an XID and a NIC link going down."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from agents.core.xid import HOLD_S
from agents.sim.bundled import DEMO_NODE, bundled_node
from agents.timing import FLAP_HOLD_S
from hack.benchlib.agent import GPU, NIC, AgentProcess, Watcher, percentile
from hack.benchlib.figures import Figure, below, skipped
from hack.benchlib.nodes import generate_node, write_yaml

TARGET_MS = 100.0
WITHIN_S = 5.0


def _round_trip(
    watcher: Watcher,
    inject: Callable[[], object],
    device: str,
    health: str,
) -> float:
    """Milliseconds from just before the fault is made to the message that shows it."""
    started = time.monotonic()
    inject()
    seen = watcher.wait_for(lambda h: h.get(device) == health, WITHIN_S)
    return (seen - started) * 1000


def xid_fault(work: Path, rounds: int) -> list[Figure]:
    node_file = work / "node.yaml"
    shutil.copy(bundled_node(DEMO_NODE), node_file)
    doc: dict[str, Any] = yaml.safe_load(node_file.read_text())
    victim = doc["gpus"][5]["uuid"]
    agent = AgentProcess(work, node_file)
    agent.start()
    try:
        agent.wait_serving([GPU])
        watcher = Watcher(agent.socket(GPU))
        try:
            watcher.wait_for(lambda h: h.get(victim) == "Healthy", WITHIN_S)
            down: list[float] = []
            up: list[float] = []
            for _ in range(rounds):
                doc["gpus"][5]["xids"] = [79]
                down.append(
                    _round_trip(watcher, lambda: write_yaml(node_file, doc), victim, "Unhealthy")
                )
                # Only a reset heals an XID: the GPU is lost, then answers again.
                doc["gpus"][5].update(xids=[], lost=True)
                losses = _log_count(agent, "lost")
                write_yaml(node_file, doc)
                _wait_log(agent, "lost", losses + 1)
                doc["gpus"][5]["lost"] = False
                up.append(
                    _round_trip(watcher, lambda: write_yaml(node_file, doc), victim, "Healthy")
                )
        finally:
            watcher.close()
    finally:
        agent.stop()
    note = f"node-file edit (atomic rename), {rounds} rounds"
    return [
        below("XID 79 -> Unhealthy p50", percentile(down, 50), "ms", TARGET_MS, note),
        below("XID 79 -> Unhealthy max", max(down), "ms", TARGET_MS),
        Figure(
            "GPU reset -> Healthy p50",
            percentile(up, 50),
            "ms",
            note=f"lost, then answering again; includes the {HOLD_S:g} s hold",
        ),
    ]


def _log_count(agent: AgentProcess, reason: str) -> int:
    text = (agent.work / "agent.log").read_text()
    return sum(
        1 for line in text.splitlines() if "device_unhealthy" in line and f'"{reason}"' in line
    )


def _wait_log(agent: AgentProcess, reason: str, count: int) -> None:
    deadline = time.monotonic() + WITHIN_S
    while _log_count(agent, reason) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the agent never logged reason={reason}")
        time.sleep(0.01)  # polling a log file, with a deadline


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def link_fault(work: Path, rounds: int) -> list[Figure]:
    """A veth in a network namespace of our own stands in for NIC 0; the agent runs there."""
    names = ("link down -> Unhealthy p50", "link down -> Unhealthy max")
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return [skipped(n, f"< {TARGET_MS:g} ms", "needs root and iproute2") for n in names]
    netns = f"nabench-{uuid.uuid4().hex[:8]}"
    ifname, peer = "bnv0", "bnv0p"
    _ip("netns", "add", netns)
    try:
        _ip("-n", netns, "link", "add", ifname, "type", "veth", "peer", "name", peer)
        _ip("-n", netns, "link", "set", peer, "up")
        _ip("-n", netns, "link", "set", ifname, "up")
        node_file = write_yaml(work / "node.yaml", generate_node(8, 8, netdevs={0: ifname}))
        return _link_rounds(work, node_file, netns, ifname, rounds)
    finally:
        subprocess.run(["ip", "netns", "del", netns], check=False, capture_output=True)


def _link_rounds(work: Path, node_file: Path, netns: str, ifname: str, rounds: int) -> list[Figure]:
    doc = yaml.safe_load(node_file.read_text())
    nic = doc["nics"][0]["pci"]
    agent = AgentProcess(work, node_file, prefix=["ip", "netns", "exec", netns])
    agent.start()
    try:
        agent.wait_serving([NIC])
        watcher = Watcher(agent.socket(NIC))
        try:
            watcher.wait_for(lambda h: h.get(nic) == "Healthy", WITHIN_S)
            down: list[float] = []
            for _ in range(rounds):
                down.append(
                    _round_trip(
                        watcher,
                        lambda: _ip("-n", netns, "link", "set", ifname, "down"),
                        nic,
                        "Unhealthy",
                    )
                )
                _round_trip(
                    watcher, lambda: _ip("-n", netns, "link", "set", ifname, "up"), nic, "Healthy"
                )
                # Flaps within the hold time are damped by design; measure fresh faults only.
                time.sleep(FLAP_HOLD_S)
        finally:
            watcher.close()
    finally:
        agent.stop()
    note = (
        f"veth in a netns, `ip link set down` (its exec counted), {rounds} rounds "
        f"{FLAP_HOLD_S:g} s apart (flap hold)"
    )
    return [
        below("link down -> Unhealthy p50", percentile(down, 50), "ms", TARGET_MS, note),
        below("link down -> Unhealthy max", max(down), "ms", TARGET_MS),
    ]
