"""The degraded-device signals through the real NVML backend (pynvml) over the test NVML
library, and the same readings from the simulated NVML for the same node: one reader,
two backends."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agents.core.degraded import Limits
from agents.core.fabric_health import HEALTHY_MASK
from agents.core.gfd_facts import Fabric
from agents.core.gpu_signals import GpuReading, GpuSignals
from agents.sim.node import load_node
from agents.sim.nvml import SimNvml
from tests.nvml.library import nvml_env
from tests.nvml.nodes import PROFILES, from_profile, from_sim_node, with_mig
from tests.nvml.state import Gpu, NvmlNode

PROBE = """
import dataclasses, json, os, sys
from agents.errors import BackendError
from agents.hw.nvml_backend import NvmlBackend
nvml = NvmlBackend()
nvml.init()
out = {}
gpus = nvml.gpus()
if len(sys.argv) > 1:  # the node changes once its GPUs are listed
    os.replace(sys.argv[1], os.environ["NODE_AGENT_NVML_STATE"])
for gpu in gpus:
    try:
        out[gpu.uuid] = dataclasses.asdict(nvml.probe(gpu.uuid))
    except BackendError as exc:
        out[gpu.uuid] = str(exc)
print(json.dumps(out))
"""


def probe_all(node: NvmlNode, tmp_path: Path, after: NvmlNode | None = None) -> dict[str, object]:
    """Each GPU's reading from the real backend in a subprocess over the library."""
    state = tmp_path / "state"
    node.write(state)
    later: list[str] = []
    if after is not None:
        after.write(tmp_path / "later")
        later.append(str(tmp_path / "later"))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(PROBE), *later],
        env=nvml_env(state),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    answers: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return answers


def as_reading(answer: object) -> GpuReading:
    assert isinstance(answer, dict), answer
    nvlinks = answer.pop("nvlinks")
    fabric = answer.pop("fabric")
    return GpuReading(
        **answer,
        nvlinks=None if nvlinks is None else tuple(nvlinks),
        fabric=None if fabric is None else Fabric(**fabric),
    )


H100_CLUSTER = "00000000-0000-0000-0000-000000000001"  # the profiles' (h100.yaml, gb200.yaml)


def faulty(gpu: Gpu) -> None:
    s = gpu.signals
    s.retired = True
    s.pcie_width, s.pcie_gen, s.utilization, s.replays = 8, 3, 90, 40
    s.clock_events = 0x40 | 0x8 | 0x1
    s.remap_pending, s.retired_pending, s.recovery, s.links_down = True, True, 1, 2
    s.memory_used_mib, s.power_mw, s.temperature, s.sm_clock_mhz = 1024, 350500, 71, 1410


def test_every_signal_reads_through_pynvml(tmp_path: Path) -> None:
    node = from_profile("h100")
    faulty(node.gpus[0])
    node.gpus[1].signals.recovery = 0  # offered, nothing to do
    node.gpus[2].signals.remap_failed = True
    readings = {u: as_reading(a) for u, a in probe_all(node, tmp_path).items()}
    uuids = [g.uuid for g in node.gpus]
    assert readings[uuids[0]] == GpuReading(
        pcie_width=8,
        pcie_max_width=16,
        pcie_gen=3,
        pcie_max_gen=5,
        utilization=90,
        pcie_replays=40,
        nvlinks=(True,) * 16 + (False,) * 2,  # 18 links of NVML's 36
        clock_events=0x49,
        remap_pending=True,
        remap_failed=False,
        retired_pages_pending=True,
        recovery_action=1,
        fabric=Fabric(H100_CLUSTER, 0, state=3, status=0, health_mask=HEALTHY_MASK),
        memory_used_bytes=1024 << 20,
        memory_total_bytes=node.gpus[0].memory,
        power_watts=350.5,
        temperature_celsius=71,
        sm_clock_mhz=1410,
    )
    assert readings[uuids[1]].recovery_action == 0
    assert readings[uuids[2]].remap_failed is True
    assert readings[uuids[3]].recovery_action is None  # the field is not offered


def test_what_a_gpu_does_not_offer_reads_none(tmp_path: Path) -> None:
    """A T4 has no NVLink and no row remapping; a MIG-enabled GPU no utilization nor
    remapped rows; a GPU whose driver does not know a PCIe figure answers NOT_SUPPORTED."""
    t4 = as_reading(next(iter(probe_all(from_profile("t4"), tmp_path).values())))
    assert (t4.nvlinks, t4.remap_pending, t4.remap_failed) == (None, None, None)
    assert t4.retired_pages_pending is False  # a T4 still retires pages
    assert (t4.pcie_gen, t4.pcie_max_gen) == (3, 3)
    mig = with_mig("h100-uniform")
    mig.gpus[0].signals.pcie_width = 0
    first = as_reading(probe_all(mig, tmp_path)[mig.gpus[0].uuid])
    assert (first.utilization, first.remap_pending, first.pcie_width) == (None, None, None)
    assert first.pcie_max_width == 16
    assert first.retired_pages_pending is None  # replaced by row remapping


def test_a_lost_gpu_is_an_error_not_a_reading(tmp_path: Path) -> None:
    node = from_profile("a100")
    later = from_profile("a100")
    later.gpus[1].lost = True
    answers = probe_all(node, tmp_path, after=later)
    assert "lost" in str(answers[node.gpus[1].uuid]).lower()
    assert as_reading(answers[node.gpus[0].uuid]).pcie_max_gen == 4


def test_an_odd_answer_leaves_only_its_field_unknown(tmp_path: Path) -> None:
    node = from_profile("h100")
    node.gpus[0].fails = {
        "nvmlDeviceGetPcieReplayCounter": 999,
        "nvmlDeviceGetCurrentClocksEventReasons": 13,  # FUNCTION_NOT_FOUND: an old driver
        "nvmlDeviceGetNvLinkState": 999,
    }
    reading = as_reading(probe_all(node, tmp_path)[node.gpus[0].uuid])
    assert reading.pcie_replays is None
    assert reading.clock_events == 0  # read through the older name instead
    assert reading.nvlinks is None  # a link that cannot be read must not look down
    assert reading.pcie_width == 16


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_reads_healthy(profile: str, tmp_path: Path) -> None:
    for answer in probe_all(from_profile(profile), tmp_path).values():
        reading = as_reading(answer)
        assert reading.pcie_width == reading.pcie_max_width == 16
        assert reading.pcie_gen == reading.pcie_max_gen
        assert (reading.clock_events, reading.pcie_replays) == (0, 0)
        assert not reading.remap_pending and not reading.retired_pages_pending
        assert (reading.retired_pages_pending is None) == (profile != "t4")


SIM_EDITS = """
  - uuid: {uuid}
    pci: "0000:{bus:02x}:00.0"
    model: NVIDIA H100 80GB HBM3
    nvlinks: [{peer}]
    pcie: {{width: 4, gen: 2, replays: 7}}
    utilization: 75
    nvlinksDown: 1
    clockEvents: [hwPowerBrake]
    remappedRows: {{pending: true, failed: true}}
    retiredPagesPending: true
"""


def test_the_real_backend_reads_a_simulated_node_as_the_simulated_nvml_does(
    tmp_path: Path,
) -> None:
    uuids = ["GPU-aaaa", "GPU-bbbb"]
    text = "nvswitch: false\ngpus:\n" + "".join(
        SIM_EDITS.format(uuid=u, bus=0x1B + i, peer=uuids[1 - i]) for i, u in enumerate(uuids)
    )
    path = tmp_path / "node.yaml"
    path.write_text(text)
    spec = load_node(path)
    sim = SimNvml(spec)
    sim.init()
    real = {u: as_reading(a) for u, a in probe_all(from_sim_node(spec), tmp_path).items()}
    for uuid in uuids:
        want = sim.probe(uuid)
        got = real[uuid]
        assert got == want


TWICE = """
import dataclasses, json, os, sys
from agents.hw.nvml_backend import NvmlBackend
nvml = NvmlBackend()
nvml.init()
gpus = nvml.gpus()
first = {g.uuid: dataclasses.asdict(nvml.probe(g.uuid)) for g in gpus}
os.replace(sys.argv[1], os.environ["NODE_AGENT_NVML_STATE"])
second = {g.uuid: dataclasses.asdict(nvml.probe(g.uuid)) for g in gpus}
print(json.dumps([first, second]))
"""


@pytest.mark.parametrize("profile", ["h100", "l40s"])
def test_links_a_gpu_lacks_stay_absent_and_its_own_links_are_read_every_round(
    profile: str, tmp_path: Path
) -> None:
    """The links that answered "no such link" are not asked again (docs/benchmarks.md):
    the second round reads as a full one would, a link gone down included."""
    node, later = from_profile(profile), from_profile(profile)
    later.gpus[0].signals.links_down = 2
    node.write(tmp_path / "state")
    later.write(tmp_path / "later")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TWICE), str(tmp_path / "later")],
        env=nvml_env(tmp_path / "state"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = json.loads(done.stdout.splitlines()[-1])
    uuid, other = node.gpus[0].uuid, node.gpus[1].uuid
    assert second[other]["nvlinks"] == first[other]["nvlinks"]
    if first[uuid]["nvlinks"] is None:  # no NVLink: none appears
        assert second[uuid]["nvlinks"] is None
        return
    was, now = first[uuid]["nvlinks"], second[uuid]["nvlinks"]
    assert len(now) == len(was) and sum(now) == sum(was) - 2


FABRIC_NODE = """
gpus:
  - uuid: GPU-aaaa
    pci: "0000:1b:00.0"
    model: NVIDIA GB200
    fabric: {{clusterUuid: {cluster}, cliqueId: 3, status: {status}, health: {health}}}
  - {{uuid: GPU-bbbb, pci: "0000:1c:00.0", model: NVIDIA GB200}}
"""


@pytest.mark.parametrize(
    ("status", "health", "message"),
    [
        ("Success", "[]", None),
        ("Success", "[degradedBandwidth]", "NVLink fabric: degraded bandwidth"),
        ("Success", "[routeRecovery]", "NVLink fabric: route recovery"),
        ("Success", "[routeUnhealthy]", "NVLink fabric: route unhealthy"),
        ("Success", "[accessTimeoutRecovery]", "NVLink fabric: access timeout recovery"),
        (
            "Success",
            "[noPartition]",
            "NVLink fabric: incorrect configuration (no partition)",
        ),
        (
            "NotReady",
            "[routeUnhealthy]",
            "NVLink fabric: registration failed (NVML status NotReady), route unhealthy",
        ),
    ],
    ids=["healthy", "bandwidth", "recovery", "route", "timeout", "config", "registration"],
)
def test_the_fabrics_health_reads_alike_through_pynvml_and_the_simulator(
    status: str, health: str, message: str | None, tmp_path: Path
) -> None:
    """The real probe over the test library and the simulated NVML read one node file's
    fabric alike, and the verdict names the condition; a GPU without fabric reads None."""
    path = tmp_path / "node.yaml"
    path.write_text(FABRIC_NODE.format(cluster=H100_CLUSTER, status=status, health=health))
    spec = load_node(path)
    sim = SimNvml(spec)
    sim.init()
    real = {u: as_reading(a) for u, a in probe_all(from_sim_node(spec), tmp_path).items()}
    assert real["GPU-aaaa"] == sim.probe("GPU-aaaa")
    assert real["GPU-bbbb"].fabric is None
    verdict = GpuSignals(Limits(), lambda: 0.0).observe(real["GPU-aaaa"])
    fabric = [s for s in verdict.signals if s.signal == "nvlink-fabric"]
    assert [s.message for s in fabric] == ([message] if message else [])


def test_a_driver_without_the_versioned_fabric_call_reports_no_health(tmp_path: Path) -> None:
    """nvmlDeviceGetGpuFabricInfo (before the V call) has no health mask: never Degraded."""
    node = from_profile("gb200")
    node.gpus[0].fails = {"nvmlDeviceGetGpuFabricInfoV": 13}  # FUNCTION_NOT_FOUND
    reading = as_reading(probe_all(node, tmp_path)[node.gpus[0].uuid])
    assert reading.fabric == Fabric(H100_CLUSTER, 0, state=3, status=0, health_mask=0)
    verdict = GpuSignals(Limits(), lambda: 0.0).observe(reading)
    assert "nvlink-fabric" not in [s.signal for s in verdict.signals]
