"""The degraded-device bench edits the simulated node as an operator would: every edit is
a node file the agent accepts, each injection changes its device's fields and its
restore brings back exactly the node it started from."""

from __future__ import annotations

import copy

import pytest
import yaml

from agents.sim.bundled import DEMO_NODE, bundled_node
from agents.sim.node import parse_node
from hack.benchlib.degraded import PHASES, SIGNALS, Signal, every_signal_on


def _node() -> dict[str, object]:
    doc: dict[str, object] = yaml.safe_load(bundled_node(DEMO_NODE).read_text())
    return every_signal_on(doc)


def test_every_signal_on_is_a_valid_node_with_each_field_present() -> None:
    doc = _node()
    spec = parse_node(yaml.safe_dump(doc), "bench")
    assert all(g.pcie.width == 16 and g.pcie.max_width == 16 for g in spec.gpus)
    assert all(n.speed_mbps == 400_000 and n.counters for n in spec.nics)


@pytest.mark.parametrize("signal", SIGNALS, ids=[s.name for s in SIGNALS])
def test_each_injection_is_a_valid_edit_and_its_restore_undoes_it(signal: Signal) -> None:
    doc = _node()
    before = copy.deepcopy(doc)
    entries = doc[signal.kind]
    assert isinstance(entries, list)
    signal.inject(entries[0])
    assert doc != before
    parse_node(yaml.safe_dump(doc), "bench")
    signal.restore(entries[0])
    assert doc == before


def test_every_signal_is_in_one_phase_with_a_healthy_gpu_left_per_victim() -> None:
    named = [name for phase in PHASES for name in phase]
    assert sorted(named) == sorted(s.name for s in SIGNALS)
    kinds = {s.name: s.kind for s in SIGNALS}
    for phase in PHASES:
        # 8 GPUs and 8 NICs: each victim sorts before the never-injected partner.
        assert sum(kinds[name] == "gpus" for name in phase) < 8
        assert sum(kinds[name] == "nics" for name in phase) < 8
