"""`hack/bench --only shares` in a tiny size: a real agent with DRA shares under MPS (the
simulator's twin daemon) gives every figure, and what it checks without timing (100
shares prepared at the peak, nothing left after a cycle) holds. Timing targets are for
full runs on a quiet machine, not judged here."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from hack.benchlib.shares import FIRST, JOINING, shares_figures

TIMED = [f"{arm} / whole-GPU prepare p50 (enforce: mps)" for arm in (JOINING, FIRST)]


@pytest.mark.timeout(240)
async def test_the_shares_bench_measures_every_figure_and_leaves_nothing(tmp_path: Path) -> None:
    figures = {f.name: f for f in await shares_figures(tmp_path, samples=6, starts=1, cycles=2)}
    assert {
        *TIMED,
        f"{JOINING} / whole-GPU prepare p50 (enforce: none)",
        "agent start -> first share served, MPS twin daemon, median",
        "100 shares prepared at each peak",
        "CDI spec files left after a cycle",
        "checkpointed claims left after a cycle",
        "agent threads growth, first cycle -> last",
        "GPUs not in DEFAULT compute mode after a cycle",
    } <= figures.keys()
    for name in TIMED:
        ratio = figures[name].value
        assert ratio is not None and math.isfinite(ratio) and ratio > 0
    failed = [f for name, f in figures.items() if f.ok is False and name not in TIMED]
    assert failed == [], [(f.name, f.value, f.note) for f in failed]
    assert figures["100 shares prepared at each peak"].ok is True
    assert figures["CDI spec files left after a cycle"].ok is True
