"""Degraded devices in DRA mode (`node-agent run --api dra`), on a simulated node and on
the real NVML backend over the test NVML library: every device's
`node-agents.io/health` attribute, a Degraded GPU's `node-agents.io/degraded` taint with
`--dra-device-taints`, and NoExecute taints for Unhealthy devices with
`--dra-evict-unhealthy`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conditions import PROCESS_WAIT as WAIT
from tests.integration.dra_node import GPU, NIC, DraNode, dra_node, ref
from tests.nvml.harness import Lab

__all__ = ["dra_node"]

HOLD_S = 1
HEALTH = "node-agents.io/health"


def _config(tmp_path: Path) -> str:
    path = tmp_path / "degraded.yaml"
    path.write_text(f"version: v1\nhealth:\n  degraded:\n    holdS: {HOLD_S}\n")
    return str(path)


def _health(node: DraNode, driver: str, name: str) -> str | None:
    device = node.devices(driver).get(name)
    return None if device is None else str(device["attributes"][HEALTH]["string"])


def _taints(node: DraNode, name: str) -> list[tuple[str, str, str]]:
    device = node.devices(GPU).get(name, {})
    return [(t["key"], t.get("value", ""), t["effect"]) for t in device.get("taints", [])]


def _narrow_link(doc: dict[str, Any]) -> None:
    doc["gpus"][2]["pcie"] = {"width": 8, "maxWidth": 16}


def _full_link(doc: dict[str, Any]) -> None:
    doc["gpus"][2].pop("pcie", None)


async def test_every_device_carries_its_grade_and_a_degraded_gpu_stays_in_the_slice(
    dra_node: DraNode, node_file: Path, edit_node: Callable[..., None], tmp_path: Path
) -> None:
    await dra_node.start(node_file, "--config", _config(tmp_path))
    for driver in (GPU, NIC):
        assert {_health(dra_node, driver, n) for n in dra_node.devices(driver)} == {"Healthy"}
    edit_node(_narrow_link)
    await dra_node.wait(lambda: _health(dra_node, GPU, "gpu-2") == "Degraded")
    assert len(dra_node.devices(GPU)) == 8
    assert _taints(dra_node, "gpu-2") == []  # no taints without --dra-device-taints
    edit_node(_full_link)
    await dra_node.wait(lambda: _health(dra_node, GPU, "gpu-2") == "Healthy", WAIT + HOLD_S)


async def test_with_device_taints_a_degraded_gpu_carries_its_signal_as_a_noschedule_taint(
    dra_node: DraNode, node_file: Path, edit_node: Callable[..., None], tmp_path: Path
) -> None:
    await dra_node.start(node_file, "--config", _config(tmp_path), "--dra-device-taints")
    edit_node(_narrow_link)
    degraded = [("node-agents.io/degraded", "pcie-width", "NoSchedule")]
    await dra_node.wait(lambda: _taints(dra_node, "gpu-2") == degraded)
    assert _health(dra_node, GPU, "gpu-2") == "Degraded"
    edit_node(_full_link)
    await dra_node.wait(lambda: _taints(dra_node, "gpu-2") == [], WAIT + HOLD_S)


async def test_with_eviction_an_unhealthy_gpu_taint_is_noexecute_a_degraded_one_is_not(
    dra_node: DraNode, node_file: Path, edit_node: Callable[..., None], tmp_path: Path
) -> None:
    await dra_node.start(
        node_file, "--config", _config(tmp_path), "--dra-device-taints", "--dra-evict-unhealthy"
    )

    def degrade_and_fail(doc: dict[str, Any]) -> None:
        _narrow_link(doc)
        doc["gpus"][5]["xids"].append(79)

    edit_node(degrade_and_fail)
    await dra_node.wait(lambda: _taints(dra_node, "gpu-5") == [(f"{GPU}/xid", "79", "NoExecute")])
    await dra_node.wait(
        lambda: (
            _taints(dra_node, "gpu-2") == [("node-agents.io/degraded", "pcie-width", "NoSchedule")]
        )
    )


async def test_a_degraded_gpu_on_the_real_nvml_backend_reaches_the_slice(
    dra_node: DraNode, tmp_path: Path
) -> None:
    lab = Lab("own", "h100", tmp_path)
    await dra_node.start(
        None,
        *("--families", "gpu", "--config", _config(tmp_path), "--dra-device-taints"),
        drivers=(GPU,),
        env=lab.env(),
    )
    name = f"gpu-{lab.node.gpus[3].minor}"
    lab.node.gpus[3].signals.pcie_width = 8
    lab.apply()
    await dra_node.wait(lambda: _health(dra_node, GPU, name) == "Degraded")
    assert _taints(dra_node, name) == [("node-agents.io/degraded", "pcie-width", "NoSchedule")]
    lab.node.gpus[3].signals.pcie_width = 16
    lab.apply()
    await dra_node.wait(lambda: _health(dra_node, GPU, name) == "Healthy", WAIT + HOLD_S)


async def test_a_degraded_gpu_is_prepared_even_where_the_kubelet_is_told_unhealthy(
    dra_node: DraNode, node_file: Path, edit_node: Callable[..., None], tmp_path: Path
) -> None:
    config = tmp_path / "report.yaml"
    config.write_text("version: v1\nhealth:\n  degraded:\n    report: unhealthy\n")
    await dra_node.start(node_file, "--config", str(config))
    edit_node(_narrow_link)
    await dra_node.wait(lambda: _health(dra_node, GPU, "gpu-2") == "Degraded")
    dra_node.claim("small-job", [("gpu", GPU, "gpu-2")])
    answer = await dra_node.kubelet.prepare(GPU, [ref("small-job")])
    assert answer.claims["small-job"].error == ""
