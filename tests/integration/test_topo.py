"""`node-agent topo` on the bundled node that holds every PCIe distance category."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.sim.bundled import bundled_node

NODE = bundled_node("all-distances")
CATEGORIES = ["PIX", "PXB", "PHB", "NODE", "SYS"]


def topo(node: Path, *args: str) -> str:
    """`node-agent topo --simulate NODE ARGS`: its output; it must exit 0."""
    done = subprocess.run(
        [sys.executable, "-m", "agents.cli", "topo", "--simulate", str(node), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    result: dict[str, Any] = json.loads(topo(NODE, "--json"))
    return result


@pytest.mark.parametrize(
    ("a", "b", "category"),
    [
        ("GPU0", "mlx5_0", "PIX"),  # both below one switch
        ("GPU0", "mlx5_1", "PXB"),  # through a second, cascaded switch
        ("GPU0", "mlx5_2", "PHB"),  # another root port of the same host bridge
        ("GPU0", "mlx5_3", "NODE"),  # another host bridge of NUMA node 0
        ("GPU0", "mlx5_4", "SYS"),  # NUMA node 1
        ("GPU0", "GPU1", "SYS"),
        ("GPU1", "mlx5_4", "PHB"),
        ("mlx5_0", "mlx5_1", "PXB"),
    ],
    ids=str,
)
def test_topo_shows_each_distance_category_between_the_expected_devices(
    report: dict[str, Any], a: str, b: str, category: str
) -> None:
    assert report["matrix"][a][b] == category
    assert report["matrix"][b][a] == category


def test_topo_matrix_is_symmetric_with_x_on_the_diagonal_and_holds_every_category(
    report: dict[str, Any],
) -> None:
    matrix = report["matrix"]
    names = [g["name"] for g in report["gpus"]] + [n["name"] for n in report["nics"]]
    assert list(matrix) == names
    for a in names:
        assert list(matrix[a]) == names
        assert matrix[a][a] == "X"
        for b in names:
            assert matrix[a][b] == matrix[b][a], (a, b)
    seen = {v for row in matrix.values() for v in row.values()}
    assert seen == {"X", *CATEGORIES}


def test_topo_pairs_point_each_gpu_to_its_nearest_nics(report: dict[str, Any]) -> None:
    assert report["pairs"] == {
        "GPU0": {"nics": ["mlx5_0"], "distance": "PIX"},
        "GPU1": {"nics": ["mlx5_4"], "distance": "PHB"},
    }
    order = {c: i for i, c in enumerate(CATEGORIES)}
    for gpu, pair in report["pairs"].items():
        row = report["matrix"][gpu]
        nearest = min(order[row[n["name"]]] for n in report["nics"])
        assert order[pair["distance"]] == nearest
        assert all(row[n] == pair["distance"] for n in pair["nics"])


def test_topo_text_output_has_devices_matrix_and_pairs() -> None:
    text = topo(NODE)
    devices, rest = text.split("Distance matrix\n", 1)
    matrix, pairs = rest.split("GPU <-> NIC pairs\n", 1)
    assert "GPU0" in devices and "adnode0" in devices
    header, *rows = matrix.strip().splitlines()
    assert header.split() == ["GPU0", "GPU1", "mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_4"]
    assert rows[0].split() == ["GPU0", "X", "SYS", "PIX", "PXB", "PHB", "NODE", "SYS"]
    assert "GPU0     -> mlx5_0 (PIX)" in pairs
    assert "GPU1     -> mlx5_4 (PHB)" in pairs
