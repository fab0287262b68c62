"""`node-agent topo` shows each device's grade from one reading of its signals, on a
simulated node where one GPU's PCIe link trained at x8, one lost NVLinks, one has a row
remap that failed, and one NIC runs at a quarter of its model's speed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.sim.bundled import bundled_node
from tests.integration.test_topo import topo


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    doc = yaml.safe_load(bundled_node("h100-8gpu-8nic").read_text())
    doc["gpus"][1]["pcie"] = {"width": 8, "maxWidth": 16}
    doc["gpus"][2]["nvlinksDown"] = 2
    doc["gpus"][3]["remappedRows"] = {"pending": True, "failed": True}
    doc["gpus"][4]["pcie"] = {"gen": 3, "maxGen": 5}  # at idle: a power saving, no fault
    doc["gpus"][5]["pcie"] = {"gen": 3, "maxGen": 5}
    doc["gpus"][5]["utilization"] = 90
    doc["gpus"][6]["clockEvents"] = ["hwSlowdown"]  # three probes in a row: not one reading
    for nic in doc["nics"]:
        nic["speedMbps"] = 100000 if nic["netdev"] == "ens1np0" else 400000
    path = tmp_path_factory.mktemp("node") / "node.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def report(node: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(topo(node, "--json"))
    return result


def test_each_gpu_has_the_grade_one_reading_tells(report: dict[str, Any]) -> None:
    grades = {g["name"]: (g["grade"], g["signals"]) for g in report["gpus"]}
    assert grades == {
        "GPU0": ("Healthy", []),
        "GPU1": ("Degraded", ["PCIe link x8 of x16"]),
        "GPU2": ("Degraded", ["NVLink 2 of 7 links down"]),
        "GPU3": ("Unhealthy", ["row remapping failed: the GPU needs replacing"]),
        "GPU4": ("Healthy", []),
        "GPU5": ("Degraded", ["PCIe gen 3 of 5 at 90 % utilization"]),
        "GPU6": ("Healthy", []),
        "GPU7": ("Healthy", []),
    }


def test_a_nic_slower_than_its_model_is_degraded(report: dict[str, Any]) -> None:
    grades = {n["netdev"]: (n["grade"], n["signals"]) for n in report["nics"]}
    assert grades.pop("ens1np0") == ("Degraded", ["ens1np0 at 100000 Mb/s, expected 400000"])
    assert len(grades) == 7 and all(g == ("Healthy", []) for g in grades.values())


def test_the_text_shows_the_grade_column_and_the_figures(node: Path) -> None:
    devices = topo(node).split("Distance matrix\n", 1)[0].strip().splitlines()[1:]
    by_name = {line.split()[0]: line.split()[1] for line in devices}
    assert by_name["GPU1"] == "Degraded" and by_name["GPU0"] == "Healthy"
    assert by_name["GPU3"] == "Unhealthy"
    line = next(d for d in devices if d.split()[0] == "GPU1")
    assert line.endswith("(PCIe link x8 of x16)")


def test_a_healthy_node_is_healthy_throughout() -> None:
    report = json.loads(topo(bundled_node("h100-8gpu-8nic"), "--json"))
    assert {d["grade"] for d in report["gpus"] + report["nics"]} == {"Healthy"}
