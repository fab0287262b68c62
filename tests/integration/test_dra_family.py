"""The GPU family's DRA devices from the real NVML backend (pynvml, in a subprocess) over
the project's NVML library: every GPU profile and the MIG layouts, names and limits, the
MIG names NVML's GI profile IDs and placements give, and the same devices as the
simulator's for a simulated node file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from agents.sim.bundled import bundled_node
from agents.sim.node import load_node
from tests.nvml.harness import Lab, lab_for
from tests.nvml.nodes import MIG_LAYOUTS, PROFILES, from_sim_node

DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


def probe(lab: Lab) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.integration.dra_probe"],
        env=lab.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    published = json.loads(done.stdout.strip().splitlines()[-1])
    assert published["driver"] == "gpu.nvidia.com"
    devices: list[dict[str, Any]] = published["devices"]
    return devices


@pytest.mark.parametrize("node", [*PROFILES, *MIG_LAYOUTS])
def test_each_profile_publishes_valid_unique_devices(node: str, tmp_path: Path) -> None:
    import re

    lab = lab_for("own", node, tmp_path)
    devices = probe(lab)
    names = [d["name"] for d in devices]
    assert len(names) == len(set(names))
    migs = {m.uuid for g in lab.node.gpus if g.mig for m in g.migs}
    whole = {g.uuid for g in lab.node.gpus if not g.mig}
    assert {d["device_id"] for d in devices} == migs | whole
    for device in devices:
        assert len(device["name"]) <= 63 and re.fullmatch(DNS_LABEL, device["name"])
        attributes = device["attributes"]
        assert len(attributes) + len(device["capacity"]) <= 32
        assert all(len(v) <= 64 for v in attributes.values() if isinstance(v, str))
        assert {"productName", "brand", "architecture", "cudaDriverVersion"} <= set(attributes)
        assert attributes["type"] == ("mig" if device["device_id"] in migs else "gpu")


def test_mig_names_on_a100_and_h100_layouts_follow_nvml(tmp_path: Path) -> None:
    for sub in ("a", "h"):
        (tmp_path / sub).mkdir()
    a100 = {d["name"]: d for d in probe(lab_for("own", "a100-mixed", tmp_path / "a"))}
    assert {n for n in a100 if n.startswith(("gpu-0-", "gpu-1-"))} == {
        "gpu-0-mig-3g20gb-9-4",
        "gpu-0-mig-2g10gb-14-0",
        "gpu-0-mig-1g5gb-19-2",
        "gpu-0-mig-1g5gb-19-3",
        "gpu-1-mig-7g40gb-0-0",
    }
    assert {n for n in a100 if n.startswith("gpu-2-")} == {
        f"gpu-2-mig-1g5gb-19-{i}" for i in range(7)
    }
    three = a100["gpu-0-mig-3g20gb-9-4"]
    assert three["resource"] == "nvidia.com/mig-3g.20gb"
    assert three["attributes"]["profile"] == "3g.20gb"
    assert three["attributes"]["architecture"] == "Ampere"
    assert three["attributes"]["cudaComputeCapability"] == {"version": "8.0.0"}
    assert three["capacity"]["memory"] == "19968Mi"
    assert {k for k in three["capacity"] if k.startswith("memorySlice")} == {
        f"memorySlice{i}" for i in range(4, 8)
    }
    h100 = probe(lab_for("own", "h100-uniform", tmp_path / "h"))
    assert {d["name"] for d in h100} == {
        f"gpu-{g}-mig-1g10gb-19-{i}" for g in range(8) for i in range(7)
    }


def test_the_real_backend_names_a_simulated_nodes_devices_as_the_simulator_does(
    tmp_path: Path,
) -> None:
    from tests.unit.test_dra_devices import _published

    spec = load_node(bundled_node("mig-mixed"))
    (tmp_path / "lab").mkdir()
    (tmp_path / "sim").mkdir()
    lab = Lab("own", "h100", tmp_path / "lab", from_sim_node(spec))
    real = {d["device_id"]: d for d in probe(lab)}
    _, simulated, _ = _published("mig-mixed", tmp_path / "sim")
    assert {d.device_id: d.name for d in simulated} == {i: d["name"] for i, d in real.items()}
    for device in simulated:
        got = real[device.device_id]["attributes"]
        for key in ("type", "uuid", "productName", "brand", "architecture", "profile"):
            assert got.get(key) == device.attributes.get(key)
        assert got["cudaComputeCapability"] == {"version": "9.0.0"}
