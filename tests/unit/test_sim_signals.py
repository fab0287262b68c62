"""The degraded-device fields of a simulated node file, and what the simulated NVML
answers from them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import yaml

from agents.core.gpu_signals import GpuReading
from agents.errors import BackendError, ConfigError
from agents.sim.node import parse_node
from agents.sim.nvml import SimNvml
from agents.sim.signal_fields import PcieSpec
from agents.sim.specs import NodeSpec

GPU_A = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
GPU_B = "GPU-bbbbbbbb-0000-0000-0000-000000000000"


def node(gpu_a: dict[str, Any] | None = None, nic: dict[str, Any] | None = None) -> NodeSpec:
    doc = {
        "gpus": [
            {"uuid": GPU_A, "pci": "0000:1b:00.0", "nvlinks": [GPU_B], **(gpu_a or {})},
            {"uuid": GPU_B, "pci": "0000:9b:00.0", "nvlinks": [GPU_A]},
        ],
        "nics": [{"pci": "0000:1c:00.0", "netdev": "ens1np0", "rdma": "mlx5_0", **(nic or {})}],
    }
    return parse_node(yaml.safe_dump(doc), "node.yaml")


def probe(spec: NodeSpec, uuid: str = GPU_A) -> GpuReading:
    nvml = SimNvml(spec)
    nvml.init()
    return nvml.probe(uuid)


def test_left_out_the_fields_answer_as_a_healthy_gpu_of_its_model() -> None:
    assert probe(node()) == GpuReading(
        pcie_width=16,
        pcie_max_width=16,
        pcie_gen=5,
        pcie_max_gen=5,
        utilization=0,
        pcie_replays=0,
        nvlinks=(True,),
        clock_events=0,
        remap_pending=False,
        remap_failed=False,
        retired_pages_pending=False,
        recovery_action=None,
        memory_used_bytes=0,  # an idle GPU's telemetry
        memory_total_bytes=81559 << 20,
        power_watts=70.0,
        temperature_celsius=30,
        sm_clock_mhz=1980,
    )
    t4 = probe(node({"model": "Tesla T4", "nvlinks": []}))
    assert (t4.pcie_max_gen, t4.nvlinks, t4.remap_pending) == (3, None, None)


def test_every_field_is_read_and_answered() -> None:
    spec = node(
        {
            "pcie": {"width": 8, "maxWidth": 16, "gen": 4, "maxGen": 5, "replays": 12},
            "utilization": 80,
            "nvlinksDown": 1,
            "clockEvents": ["hwSlowdown", "hwThermalSlowdown", "hwPowerBrake"],
            "remappedRows": {"pending": True, "failed": True},
            "retiredPagesPending": True,
            "memoryUsedMiB": 2048,
            "powerWatts": 512.5,
            "temperature": 77,
            "smClockMHz": 1200,
        },
        {"speedMbps": 100000, "counters": {"symbol_error": 3}, "carrierChanges": 4},
    )
    gpu = spec.gpus[0]
    assert gpu.pcie == PcieSpec(8, 16, 4, 5, 12)
    reading = probe(spec)
    assert (reading.pcie_width, reading.pcie_gen, reading.pcie_replays) == (8, 4, 12)
    assert (reading.utilization, reading.nvlinks, reading.clock_events) == (80, (False,), 0xC8)
    assert reading.remap_pending and reading.remap_failed and reading.retired_pages_pending
    telemetry = (reading.memory_used_bytes, reading.power_watts, reading.temperature_celsius)
    assert telemetry == (2048 << 20, 512.5, 77) and reading.sm_clock_mhz == 1200
    nic = spec.nics[0]
    assert (nic.speed_mbps, nic.counters, nic.carrier_changes) == (
        100000,
        (("symbol_error", 3),),
        4,
    )


def test_a_down_nvlink_is_not_listed_among_the_peers() -> None:
    nvml = SimNvml(node({"nvlinksDown": 1}))
    nvml.init()
    assert [g.nvlink_peers for g in nvml.gpus()] == [(), ("00000000:1B:00.0",)]


def test_nvswitch_links_down_are_counted_out_of_eighteen() -> None:
    spec = dataclasses.replace(node({"nvlinksDown": 2}), nvswitch=True)
    reading = probe(spec)
    assert reading.nvlinks == (True,) * 16 + (False,) * 2
    nvml = SimNvml(spec)
    nvml.init()
    assert nvml.gpus()[0].nvswitch_links == 16


def test_a_mig_enabled_gpu_answers_no_utilization_nor_remapped_rows() -> None:
    mig = {"enabled": True, "instances": [{"uuid": "MIG-1", "profile": "1g.10gb"}]}
    reading = probe(node({"mig": mig, "utilization": 90}))
    assert (reading.utilization, reading.remap_pending, reading.remap_failed) == (None,) * 3


def test_an_edit_is_answered_at_the_next_probe() -> None:
    nvml = SimNvml(node())
    nvml.init()
    assert nvml.probe(GPU_A).pcie_width == 16
    nvml.update(node({"pcie": {"width": 4}}))
    assert nvml.probe(GPU_A).pcie_width == 4


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        pytest.param({"lost": True}, "lost", id="lost"),
        pytest.param({"nvml": {"error": "Unknown"}}, "Unknown", id="failing"),
    ],
)
def test_a_lost_or_failing_gpu_is_a_backend_error(fields: dict[str, Any], error: str) -> None:
    with pytest.raises(BackendError, match=error):
        probe(node(fields))


def test_a_gpu_answering_not_supported_reads_nothing() -> None:
    assert probe(node({"nvml": {"error": "NotSupported"}})) == GpuReading()


@pytest.mark.parametrize(
    ("gpu", "nic", "key"),
    [
        pytest.param({"pcie": {"width": -1}}, None, "gpus[0].pcie.width", id="width-negative"),
        pytest.param({"pcie": {"lanes": 8}}, None, "gpus[0].pcie.lanes", id="pcie-unknown-key"),
        pytest.param({"pcie": 16}, None, "gpus[0].pcie", id="pcie-not-a-mapping"),
        pytest.param({"utilization": 101}, None, "gpus[0].utilization", id="over-100"),
        pytest.param({"nvlinksDown": -1}, None, "gpus[0].nvlinksDown", id="links-negative"),
        pytest.param(
            {"clockEvents": ["swPowerCap"]}, None, "gpus[0].clockEvents[0]", id="sw-event"
        ),
        pytest.param(
            {"remappedRows": {"pending": "yes"}},
            None,
            "gpus[0].remappedRows.pending",
            id="remap-not-bool",
        ),
        pytest.param(
            {"retiredPagesPending": 1}, None, "gpus[0].retiredPagesPending", id="pages-not-bool"
        ),
        pytest.param(None, {"speedMbps": "fast"}, "nics[0].speedMbps", id="speed-text"),
        pytest.param(
            None, {"counters": {"symbol_error": -1}}, "nics[0].counters.symbol_error", id="neg"
        ),
        pytest.param(None, {"counters": {"../x": 1}}, "nics[0].counters.../x", id="bad-name"),
        pytest.param(None, {"counters": [1]}, "nics[0].counters", id="counters-list"),
        pytest.param(None, {"carrierChanges": -2}, "nics[0].carrierChanges", id="changes-neg"),
    ],
)
def test_malformed_signal_fields_name_the_key(
    gpu: dict[str, Any] | None, nic: dict[str, Any] | None, key: str
) -> None:
    with pytest.raises(ConfigError) as err:
        node(gpu, nic)
    assert key in str(err.value)
