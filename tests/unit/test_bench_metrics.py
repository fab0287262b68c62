"""The metrics benchmark counts an exposition's series as Prometheus would store them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, Histogram, generate_latest

from hack.benchlib.metrics_cost import samples


def test_samples_counts_every_series_and_those_of_one_metric() -> None:
    registry = CollectorRegistry()
    held = Gauge("node_agent_device_allocated", "held", ["device"], registry=registry)
    for device in ("a", "b", "c"):
        held.labels(device).set(1)
    Histogram("node_agent_rpc_duration_seconds", "rpc", buckets=(0.1, 1.0), registry=registry)
    body = generate_latest(registry)
    # 3 gauges; the histogram's 3 buckets (+Inf with them), _count, _sum and _created.
    assert samples(body) == 3 + 3 + 3
    assert samples(body, "node_agent_device_allocated{") == 3
    assert samples(body, "node_agent_rpc_duration_seconds_bucket{") == 3
