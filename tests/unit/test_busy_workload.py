"""The occupied-node bench asks what a kubelet asks: available = free devices and those
already picked, must-include = those already picked, size = the whole request."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from agents.sim.node import load_node
from hack.benchlib.agent import GPU, NIC
from hack.benchlib.nodes import generate_node, irregular_node, write_yaml
from hack.benchlib.occupied import Ask, Model, Workload


def test_irregular_nodes_are_valid_node_files_with_devices_at_every_distance(
    tmp_path: Path,
) -> None:
    doc = irregular_node(random.Random(5), 32, 16)
    node = load_node(write_yaml(tmp_path / "node.yaml", doc))
    assert (len(node.gpus), len(node.nics)) == (32, 16)
    model = Model(doc)
    costs = model.costs[GPU]
    assert len(set(costs.twins)) > 16  # few devices are alike: the searches have work


@pytest.mark.parametrize("replicas", [0, 8], ids=["whole-gpus", "replicas"])
def test_workload_asks_as_the_kubelet_does(replicas: int) -> None:
    model = Model(generate_node(8, 8), replicas=replicas)
    workload = Workload(model.devices, random.Random(3))
    asks: list[tuple[Ask, dict[str, set[str]], dict[str, list[str]]]] = []

    def choose(ask: Ask) -> list[str]:
        free = {r: workload.free(r) for r in (GPU, NIC)}
        current = dict(workload.pods[f"pod-{workload.admitted - 1}"])
        asks.append((ask, free, current))
        return (
            sorted(ask.must)
            + sorted(set(ask.available) - set(ask.must))[: ask.size - len(ask.must)]
        )

    admitted = workload.admissions(choose)
    for _ in range(200):
        next(admitted)
    assert any(ask.must for ask, _, _ in asks)
    assert any(ask.container_other for ask, _, _ in asks)
    for ask, free, current in asks:
        other = NIC if ask.resource == GPU else GPU
        # The devices already picked are free ones the pod takes first.
        assert set(ask.available) == free[ask.resource]
        assert set(ask.must) <= set(ask.available)
        assert len(ask.must) <= ask.size <= len(ask.available)
        assert ask.container_other == frozenset(current.get(other, ()))
        assert ask.other_free == free[other]
