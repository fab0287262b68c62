"""Allocate and GetPreferredAllocation round trips over the unix socket, p50 and p99."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from hack.benchlib.agent import AgentProcess, Client, percentile, timed_each
from hack.benchlib.figures import Figure, below

TARGET_P99_MS = 2.0
WARMUP = 20


def measure_resource(
    client: Client, label: str, n: int, rng: random.Random, max_size: int = 8
) -> list[Figure]:
    """Random requests, drawn before the clock starts: only the round trip is timed, not
    the shuffling of a 512-device list that stands in for the kubelet's own work."""
    ids = sorted(client.devices())
    top = min(max_size, len(ids))

    def allocations(count: int) -> Iterator[Callable[[], object]]:
        for _ in range(count):
            yield partial(client.allocate, rng.sample(ids, rng.randint(1, top)))

    def preferences(count: int) -> Iterator[Callable[[], object]]:
        for _ in range(count):
            size = rng.randint(1, top)
            available = rng.sample(ids, len(ids))
            must = rng.sample(available, rng.randint(0, min(2, size)))
            yield partial(_prefer, client, available, must, size)

    figures: list[Figure] = []
    for rpc, requests in (("Allocate", allocations), ("GetPreferredAllocation", preferences)):
        warmup = list(requests(WARMUP))
        calls = list(requests(n))
        for call in warmup:
            call()
        ms = [s * 1000 for s in timed_each(calls)]
        name = f"{rpc} {label}"
        figures.append(below(f"{name} p50", percentile(ms, 50), "ms", TARGET_P99_MS))
        figures.append(below(f"{name} p99", percentile(ms, 99), "ms", TARGET_P99_MS))
    return figures


def _prefer(client: Client, available: list[str], must: list[str], size: int) -> None:
    answer = client.preferred(available, must, size)
    if len(answer) != size:
        raise AssertionError(f"preferred answer of {len(answer)} devices, asked {size}")


def measure_node(
    work: Path,
    node_file: Path,
    config: dict[str, Any] | None,
    cases: Sequence[tuple[str, str]],
    n: int,
    *,
    seed: int = 1,
) -> list[Figure]:
    """Start an agent (no kubelet needed to answer RPCs) and time each (resource, label)."""
    agent = AgentProcess(work, node_file, config=config)
    agent.start()
    try:
        agent.wait_serving([resource for resource, _ in cases])
        figures: list[Figure] = []
        for resource, label in cases:
            with Client(agent.socket(resource)) as client:
                figures += measure_resource(client, label, n, random.Random(seed))
        return figures
    finally:
        agent.stop()
