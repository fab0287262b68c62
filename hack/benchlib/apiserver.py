"""The API server's part: RPC round trips and fault -> kubelet time with the API server
reachable, refusing connections and never answering, beside an agent without reports;
fault -> Event time; the agent's memory in each case."""

from __future__ import annotations

import asyncio
import random
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from agents.cluster.client import Access, ApiClient
from hack.benchlib.agent import GPU, AgentProcess, Client, Watcher, percentile
from hack.benchlib.figures import Figure, below, info
from hack.benchlib.latency import measure_resource
from hack.benchlib.nodes import generate_node, write_yaml

NODE = "bench-node"
MODES = ("off", "reachable", "refused", "never answers")
KUBELET_TARGET_MS = 1000.0  # a fault reaches the kubelet within this, API server or not
EVENT_TARGET_MS = 2000.0
RATIO = 1.2  # RPC p99 with the API server away, at most this times the reachable one
WITHIN_S = 10.0
STANDIN = (sys.executable, "-m", "tests.standin.apiserver")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _standin(mode: str) -> tuple[subprocess.Popen[bytes] | None, str]:
    """The stand-in in a process of its own (none for 'off'), and its URL."""
    port = _free_port()
    if mode == "off":
        return None, ""
    wire = {"reachable": "up", "refused": "refuse", "never answers": "hang"}[mode]
    proc = subprocess.Popen(
        [*STANDIN, "--port", str(port), "--node", NODE, "--mode", wire],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().decode().strip()  # printed once it listens
    return proc, url


def _kubeconfig(work: Path, url: str) -> Path:
    doc = {
        "apiVersion": "v1",
        "current-context": "bench",
        "clusters": [{"name": "bench", "cluster": {"server": url}}],
        "users": [{"name": "agent", "user": {"token": "bench"}}],
        "contexts": [{"name": "bench", "context": {"cluster": "bench", "user": "agent"}}],
    }
    path = work / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def _warnings(url: str) -> int:
    async def ask() -> int:
        async with ApiClient(Access(url)) as client:
            events = await client.list("/api/v1/namespaces/default/events")
        return sum(e.get("count", 0) for e in events.items if e["type"] == "Warning")

    return asyncio.run(ask())


def _faults(
    agent: AgentProcess, node_file: Path, rounds: int, url: str | None
) -> tuple[list[float], list[float]]:
    """XID 79 on GPU i in round i: ms to the kubelet's stream, and to the Event (if any)."""
    doc: dict[str, Any] = yaml.safe_load(node_file.read_text())
    kubelet_ms: list[float] = []
    event_ms: list[float] = []
    watcher = Watcher(agent.socket(GPU))
    try:
        watcher.wait_for(lambda h: h != {} and set(h.values()) == {"Healthy"}, WITHIN_S)
        for i in range(rounds):
            victim = doc["gpus"][i]["uuid"]
            doc["gpus"][i]["xids"] = [79]
            started = time.monotonic()
            write_yaml(node_file, doc)

            def shows(health: dict[str, str], victim: str = victim) -> bool:
                return health.get(victim) == "Unhealthy"

            seen = watcher.wait_for(shows, WITHIN_S)
            kubelet_ms.append((seen - started) * 1000)
            if url:
                deadline = time.monotonic() + WITHIN_S
                while _warnings(url) < i + 1:
                    if time.monotonic() > deadline:
                        raise TimeoutError("no Warning Event")
                    time.sleep(0.005)  # polling the stand-in, with a deadline
                event_ms.append((time.monotonic() - started) * 1000)
    finally:
        watcher.close()
    return kubelet_ms, event_ms


def _one_mode(work: Path, mode: str, n: int, rounds: int) -> dict[str, Any]:
    work.mkdir()
    node_file = write_yaml(work / "node.yaml", generate_node(16, 8))
    proc, url = _standin(mode)
    extra = [] if mode == "off" else ["--kubeconfig", str(_kubeconfig(work, url))]
    agent = AgentProcess(work, node_file, extra=[*extra, "--node-name", NODE])
    agent.start()
    try:
        agent.wait_serving([GPU])
        with Client(agent.socket(GPU)) as client:
            rpc = measure_resource(client, "", n, random.Random(1))
        kubelet_ms, event_ms = _faults(
            agent, node_file, rounds, url if mode == "reachable" else None
        )
        return {"rpc": rpc, "kubelet": kubelet_ms, "event": event_ms, "rss": agent.rss_kib() / 1024}
    finally:
        agent.stop()
        if proc is not None:
            proc.kill()
            proc.wait()


def apiserver_figures(root: Path, n: int, rounds: int) -> list[Figure]:
    runs = {mode: _one_mode(root / mode.replace(" ", "-"), mode, n, rounds) for mode in MODES}
    figures: list[Figure] = []
    reach = {f.name: f.value or 0.0 for f in runs["reachable"]["rpc"]}
    for mode, run in runs.items():
        for f in run["rpc"]:
            if not f.name.endswith("p99"):
                continue
            name = f"{f.name.replace('  ', ' ')} (API {mode})"
            if mode in ("refused", "never answers"):
                figures.append(below(name, f.value or 0.0, "ms", round(RATIO * reach[f.name], 2)))
            else:
                figures.append(info(name, f.value or 0.0, "ms"))
        kubelet = run["kubelet"]
        figures.append(
            below(
                f"XID 79 -> kubelet p50 (API {mode})",
                percentile(kubelet, 50),
                "ms",
                KUBELET_TARGET_MS,
            )
        )
        figures.append(
            below(f"XID 79 -> kubelet max (API {mode})", max(kubelet), "ms", KUBELET_TARGET_MS)
        )
        figures.append(info(f"agent RSS after the faults (API {mode})", run["rss"], "MB"))
    event = runs["reachable"]["event"]
    note = f"{rounds} rounds on a 16-GPU node, node-file edit to the stand-in's Event list"
    figures.append(
        below("XID 79 -> Warning Event p50", percentile(event, 50), "ms", EVENT_TARGET_MS, note)
    )
    figures.append(below("XID 79 -> Warning Event max", max(event), "ms", EVENT_TARGET_MS))
    return figures
