"""What /metrics costs: scrape time, series, RSS and idle CPU of the agent with metrics and
telemetry on, beside the same agent without --metrics-address, in one run on one node."""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from agents.standin.kubelet import Container, Kubelet, Pod
from hack.benchlib.agent import (
    GPU,
    NIC,
    AgentProcess,
    cpu_seconds_between,
    percentile,
    proc_cpu_reading,
)
from hack.benchlib.figures import Figure, below, info
from hack.benchlib.nodes import generate_node, sharing_config, write_yaml

GPUS, NICS, REPLICAS = 8, 8, 48
SCRAPE_P99_MS = 50.0
RSS_EXTRA_MB = 3.0
IDLE_EXTRA_POINTS = 0.1
SCRAPE_INTERVAL_S = 30.0  # the chart's ServiceMonitor interval
SETTLE_S = 3.0  # start-up work (the heap frozen a second after start) ends before the window
WITHIN_S = 60.0


@dataclass
class Side:
    """One agent under its own kubelet stand-in, with pods holding its devices."""

    agent: AgentProcess
    kubelet: Kubelet


def _node(work: Path) -> Path:
    doc = generate_node(GPUS, NICS)
    for nic in doc["nics"]:
        nic["speedMbps"] = 400000  # a speed file, as a real NIC has: its readings exist
    return write_yaml(work / "node.yaml", doc)


def _side(work: Path, metrics: bool) -> Side:
    work.mkdir()
    socket = work / "pr.sock"
    extra = ["--pod-resources-socket", str(socket), "--cdi-root", str(work / "cdi")]
    extra += ["--kubelet-plugins-dir", str(work / "kubelet-plugins")]
    if metrics:
        extra += ["--metrics-address", "127.0.0.1:0"]
    agent = AgentProcess(work, _node(work), config=sharing_config(REPLICAS), extra=extra)
    kubelet = Kubelet(agent.plugin_dir, seed=1, pod_resources_socket=socket)
    return Side(agent, kubelet)


def _registered(kubelet: Kubelet) -> bool:
    gpu, nic = kubelet.resource(GPU), kubelet.resource(NIC)
    return all(
        view is not None and view.connected and len(view.devices) == n
        for view, n in ((gpu, GPUS * REPLICAS), (nic, NICS))
    )


async def _fill(kubelet: Kubelet) -> int:
    """Every replica held, one a pod, the first NICS pods holding a NIC too: the most
    node_agent_device_allocated series the node can have. Returns the devices held."""
    for i in range(GPUS * REPLICAS):
        containers = [Container("main", {GPU: 1})]
        if i < NICS:
            containers.append(Container("net", {NIC: 1}))
        await kubelet.admit(Pod(f"pod-{i:03d}", containers))
    return GPUS * REPLICAS + NICS


def _metrics_port(log: Path) -> int | None:
    for line in log.read_text().splitlines():
        if '"metrics_serving"' in line:
            return int(json.loads(line)["address"].rpartition(":")[2])
    return None


def _scrape(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        body: bytes = reply.read()
        return body


def samples(exposition: bytes, name: str = "") -> int:
    """The samples (series) in a text exposition, or those of one metric."""
    lines = exposition.decode().splitlines()
    return sum(1 for line in lines if line and not line.startswith("#") and line.startswith(name))


async def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WITHIN_S
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {WITHIN_S:g} s")
        await asyncio.sleep(0.2)


def _timed_scrapes(port: int, n: int) -> tuple[list[float], bytes]:
    """n scrapes one after the other (in a thread: the stand-in's pod-resources answers on
    the loop); each one's time in ms and the last exposition."""
    times: list[float] = []
    body = b""
    for _ in range(n):
        at = time.perf_counter()
        body = _scrape(port)
        times.append((time.perf_counter() - at) * 1000)
    return times, body


def _rss_mb(agent: AgentProcess) -> float:
    return agent.rss_kib() / 1024


@dataclass
class Measured:
    idle_pct: dict[str, float]
    rss_mb: dict[str, float]
    scrape_ms: list[float]
    scrape_cpu_ms: float  # the agent's CPU per scrape
    series: int
    allocated: int
    held: int
    window_s: float
    load: list[float]


async def _measure(sides: dict[str, Side], port: int, held: int, idle_s: float, n: int) -> Measured:
    def allocated() -> bool:
        return samples(_scrape(port), "node_agent_device_allocated{") == held

    await _wait_threaded(allocated, "node_agent_device_allocated series for every device held")
    await asyncio.sleep(SETTLE_S)
    load = [os.getloadavg()[0]]
    before = {k: proc_cpu_reading(s.agent.pid) for k, s in sides.items()}
    at = time.monotonic()
    await asyncio.sleep(idle_s)  # the idle window: both agents at rest, no scrape
    window = time.monotonic() - at
    idle = {
        k: cpu_seconds_between(before[k], proc_cpu_reading(s.agent.pid)) / window * 100
        for k, s in sides.items()
    }
    load.append(os.getloadavg()[0])
    cpu = proc_cpu_reading(sides["on"].agent.pid)
    times, body = await asyncio.to_thread(_timed_scrapes, port, n)
    spent = cpu_seconds_between(cpu, proc_cpu_reading(sides["on"].agent.pid))
    load.append(os.getloadavg()[0])
    return Measured(
        idle_pct=idle,
        rss_mb={k: _rss_mb(s.agent) for k, s in sides.items()},
        scrape_ms=times,
        scrape_cpu_ms=spent / n * 1000,
        series=samples(body),
        allocated=samples(body, "node_agent_device_allocated{"),
        held=held,
        window_s=window,
        load=load,
    )


async def _wait_threaded(condition: Callable[[], bool], what: str) -> None:
    async def check() -> bool:
        try:
            return await asyncio.to_thread(condition)
        except OSError:
            return False

    deadline = time.monotonic() + WITHIN_S
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {WITHIN_S:g} s")
        await asyncio.sleep(0.2)


async def metrics_figures(
    root: Path, scrapes: int, idle_s: float, progress: Callable[[str], None]
) -> list[Figure]:
    sides = {"off": _side(root / "off", False), "on": _side(root / "on", True)}
    for side in sides.values():
        await side.kubelet.start()
    try:
        for side in sides.values():
            side.agent.start()
        for side in sides.values():
            await _wait(partial(_registered, side.kubelet), "registration with the kubelet")
        progress(f"metrics: {GPUS * REPLICAS} pods holding the replicas (and NICs), each agent")
        for side in sides.values():
            held = await _fill(side.kubelet)
        log = sides["on"].agent.work / "agent.log"
        await _wait(lambda: _metrics_port(log) is not None, "metrics_serving in the log")
        port = _metrics_port(log)
        assert port is not None
        progress(f"metrics: idle window of {idle_s:g} s, then {scrapes} scrapes")
        measured = await _measure(sides, port, held, idle_s, scrapes)
    finally:
        for side in sides.values():
            side.agent.stop()
            await side.kubelet.stop()
    return _figures(measured)


def _figures(m: Measured) -> list[Figure]:
    off, on = m.idle_pct["off"], m.idle_pct["on"]
    with_scrapes = on + m.scrape_cpu_ms / 1000 / SCRAPE_INTERVAL_S * 100
    rss = m.rss_mb["on"] - m.rss_mb["off"]
    node = f"{GPUS} GPUs x {REPLICAS} replicas (time-slicing), {NICS} NICs"
    load = " -> ".join(f"{x:.2f}" for x in m.load)
    return [
        below(
            "scrape p50",
            percentile(m.scrape_ms, 50),
            "ms",
            SCRAPE_P99_MS,
            f"{len(m.scrape_ms)} GETs of /metrics one after the other, {node}, {m.held} devices "
            f"held by {GPUS * REPLICAS} pods (pod-resources from the kubelet stand-in); "
            f"1-min load average {load} (idle window start, end, after the scrapes)",
        ),
        below("scrape p99", percentile(m.scrape_ms, 99), "ms", SCRAPE_P99_MS),
        info("scrape max", max(m.scrape_ms), "ms"),
        info("agent CPU per scrape", m.scrape_cpu_ms, "ms", "schedstat over the scrapes"),
        info(
            "series per node",
            m.series,
            "",
            f"samples in the exposition, {m.allocated} of them node_agent_device_allocated "
            f"({m.held} devices held)",
        ),
        info("RSS, metrics off (reference)", m.rss_mb["off"], "MB", "after the scrapes"),
        below("RSS, metrics on - off", rss, "MB", RSS_EXTRA_MB),
        info(
            "idle CPU, metrics off (reference)",
            off,
            "%",
            f"{off:.3f} %: the same agent without --metrics-address, at rest in the same "
            f"{m.window_s:.0f} s window (schedstat)",
        ),
        Figure(
            "idle CPU, metrics on",
            on,
            "%",
            f"<= {off + IDLE_EXTRA_POINTS:.2f} %",
            on <= off + IDLE_EXTRA_POINTS,
            f"{on:.3f} % (+{on - off:.3f} point): telemetry every probe round, pod-resources "
            "asked every 10 s, no scrape in the window",
        ),
        Figure(
            f"idle CPU, metrics on, a scrape every {SCRAPE_INTERVAL_S:g} s",
            with_scrapes,
            "%",
            f"<= {off + IDLE_EXTRA_POINTS:.2f} %",
            with_scrapes <= off + IDLE_EXTRA_POINTS,
            f"{with_scrapes:.3f} % (+{with_scrapes - off:.3f} point): the window's plus the "
            f"CPU per scrape over the ServiceMonitor's {SCRAPE_INTERVAL_S:g} s interval",
        ),
    ]
