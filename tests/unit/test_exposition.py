"""The agent's own text exposition reads back, through the Prometheus client library's
parser, as the same names, types, labels and values: tricky label values included."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from agents.exposition import Counter, Family, Gauge, Histogram, Registry, number, write

TRICKY = ['a\\b"c\nd', "\\", '"', "\n", "\\n", "ends with \\", "", "ünï €", "a=b,c}{"]


def parsed(body: bytes) -> dict[str, tuple[str, str, list[tuple[str, dict[str, str], float]]]]:
    """family name -> (type, help, [(sample name, labels, value)])"""
    return {
        f.name: (f.type, f.documentation, [(s.name, s.labels, s.value) for s in f.samples])
        for f in text_string_to_metric_families(body.decode())
    }


@pytest.mark.parametrize("value", TRICKY, ids=repr)
def test_a_label_value_reads_back_as_written(value: str) -> None:
    family = Family("node_agent_node_label", "A label", ["name", "value"])
    family.add(["x", value], 1)
    _, _, samples = parsed(write([family]))["node_agent_node_label"]
    assert samples == [("node_agent_node_label", {"name": "x", "value": value}, 1.0)]


@given(st.lists(st.text(), min_size=3, max_size=3))
def test_any_label_values_read_back_as_written(values: list[str]) -> None:
    gauge = Gauge("g", "help", ["a", "b", "c"])
    gauge.labels(*values).set(2)
    _, _, samples = parsed(write(gauge.collect()))["g"]
    assert samples == [("g", dict(zip("abc", values, strict=True)), 2.0)]


def test_help_text_with_a_backslash_and_a_newline_reads_back() -> None:
    text = 'first line\nsecond \\ with "quotes"'
    kind, help_text, _ = parsed(write([Family("g", text)]))["g"]
    assert (kind, help_text) == ("gauge", text)


def test_label_names_are_written_sorted_and_series_in_the_order_they_came() -> None:
    gauge = Gauge("g", "help", ["resource", "device"])
    gauge.labels("r", "2").set(1)
    gauge.labels("r", "1").set(1)
    body = write(gauge.collect()).decode().splitlines()
    assert body[2:] == ['g{device="2",resource="r"} 1.0', 'g{device="1",resource="r"} 1.0']


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (float("nan"), "NaN"),
        (math.inf, "+Inf"),
        (-math.inf, "-Inf"),
        (16, "16.0"),
        (0.25, "0.25"),
        (-0.0, "-0.0"),
        (1e-07, "1e-07"),
        (85899345920, "85899345920.0"),
        (1e22, "1e+22"),
    ],
    ids=str,
)
def test_values_are_written_as_prometheus_reads_them(value: float, text: str) -> None:
    assert number(value) == text
    read = float(text.replace("Inf", "inf"))
    assert read == value or (math.isnan(read) and math.isnan(value))


def test_a_counter_is_written_as_total_with_its_creation_time_beside_it() -> None:
    registry = Registry()
    counter = registry.register(Counter("node_agent_allocations", "Served", ["resource"]))
    counter.labels("nvidia.com/gpu").inc()
    counter.labels("nvidia.com/gpu").inc(2)
    families = parsed(registry.exposition())
    kind, _, samples = families["node_agent_allocations"]
    assert kind == "counter"
    assert samples[0] == ("node_agent_allocations_total", {"resource": "nvidia.com/gpu"}, 3.0)
    created = samples[1] if len(samples) > 1 else families["node_agent_allocations_created"][2][0]
    assert created[0] == "node_agent_allocations_created" and created[2] > 1.7e9
    with pytest.raises(ValueError, match="only grows"):
        counter.labels("nvidia.com/gpu").inc(-1)


def test_a_histogram_has_cumulative_buckets_up_to_inf_then_count_and_sum() -> None:
    histogram = Histogram("rpc_seconds", "RPC latency", ["method"], buckets=(0.1, 1.0))
    for seconds in (0.05, 0.1, 0.5, 3.0):  # a bound is inclusive: 0.1 is in le="0.1"
        histogram.labels("Allocate").observe(seconds)
    kind, _, samples = parsed(write(histogram.collect()))["rpc_seconds"]
    assert kind == "histogram"
    got = [(name, labels.get("le"), value) for name, labels, value in samples]
    assert got[:5] == [
        ("rpc_seconds_bucket", "0.1", 2.0),
        ("rpc_seconds_bucket", "1.0", 3.0),
        ("rpc_seconds_bucket", "+Inf", 4.0),
        ("rpc_seconds_count", None, 4.0),
        ("rpc_seconds_sum", None, 3.65),
    ]
    assert all(labels["method"] == "Allocate" for _, labels, _ in samples)


def test_a_removed_series_is_gone_and_removing_it_again_is_a_key_error() -> None:
    gauge = Gauge("g", "help", ["device"])
    gauge.labels("a").set(1)
    gauge.remove("a")
    assert parsed(write(gauge.collect()))["g"][2] == []
    with pytest.raises(KeyError):
        gauge.remove("a")


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: Gauge("g", "h", ["a"]).labels("x", "y"), id="too-many-values"),
        pytest.param(lambda: Family("g", "h", ["a"]).add([], 1), id="too-few-values"),
        pytest.param(lambda: Gauge("g", "h", ["a", "a"]), id="label-twice"),
        pytest.param(lambda: Histogram("h", "h", ["le"], buckets=(1.0,)), id="le-label"),
        pytest.param(lambda: Histogram("h", "h", [], buckets=(2.0, 1.0)), id="buckets-unsorted"),
    ],
)
def test_a_metric_used_wrongly_is_a_value_error(make: object) -> None:
    assert callable(make)
    with pytest.raises(ValueError):
        make()
