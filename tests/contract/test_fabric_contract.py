"""GFD's NVML facts (compute capability, MIG capability, the NVLink fabric) answered alike by
the simulator and by the real backend over the test NVML library, for the same node."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agents.core.fabric_health import HEALTHY_MASK
from agents.core.gfd_facts import Fabric
from agents.errors import BackendError
from agents.hw.nvml import GpuFabrics
from agents.sim.bundled import bundled_node
from agents.sim.node import load_node
from agents.sim.nvml import SimNvml
from agents.sim.specs import NodeSpec
from tests.nvml.library import nvml_env
from tests.nvml.nodes import REPO, from_sim_node

REAL = """
import json
from agents.hw.nvml_backend import NvmlBackend
nvml = NvmlBackend()
nvml.init()
out = []
for g in nvml.gpus():
    fabric = nvml.fabric(g.uuid)
    facts = list(vars(fabric).values()) if fabric is not None else None
    out.append([g.uuid, g.mig_capable, g.compute_capability, facts])
print(json.dumps(out))
"""


def answers(nvml: SimNvml) -> list[list[object]]:
    nvml.init()
    assert isinstance(nvml, GpuFabrics)
    out: list[list[object]] = []
    for gpu in nvml.gpus():
        fabric = nvml.fabric(gpu.uuid)
        facts = list(vars(fabric).values()) if fabric is not None else None
        out.append([gpu.uuid, gpu.mig_capable, gpu.compute_capability, facts])
    return out


def real_answers(node: NodeSpec, tmp_path: Path) -> list[list[object]]:
    state = tmp_path / "state"
    from_sim_node(node).write(state)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(REAL)],
        cwd=REPO,
        env=nvml_env(state),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: list[list[object]] = json.loads(done.stdout)
    return result


def _second(node: NodeSpec, **fabric: object) -> NodeSpec:
    """The node with its second GPU's fabric changed."""
    gpus = list(node.gpus)
    assert gpus[1].fabric is not None
    gpus[1] = dataclasses.replace(gpus[1], fabric=dataclasses.replace(gpus[1].fabric, **fabric))  # type: ignore[arg-type]
    return dataclasses.replace(node, gpus=tuple(gpus))


GB200 = load_node(bundled_node("gb200-4gpu-4nic"))
NODES = {
    "gb200-attached": GB200,
    "gb200-registering": _second(GB200, state=2),
    "gb200-clique-differs": _second(GB200, clique_id=7),
    "gb200-failed": _second(GB200, status=999),
    "h100-no-fabric": load_node(bundled_node("h100-8gpu-8nic")),
    "mig-mixed": load_node(bundled_node("mig-mixed")),
}


@pytest.mark.parametrize("name", NODES)
def test_real_and_simulated_backends_answer_gfds_facts_alike(name: str, tmp_path: Path) -> None:
    node = NODES[name]
    simulated = answers(SimNvml(node))
    assert simulated == real_answers(node, tmp_path)
    assert any(f is not None for *_, f in simulated) == name.startswith("gb200")


def test_a_lost_gpus_fabric_is_a_backend_error_in_the_simulator() -> None:
    gpus = (dataclasses.replace(GB200.gpus[0], lost=True), *GB200.gpus[1:])
    nvml = SimNvml(dataclasses.replace(GB200, gpus=gpus))
    nvml.init()
    with pytest.raises(BackendError):
        nvml.fabric(GB200.gpus[0].uuid)
    assert nvml.fabric(GB200.gpus[1].uuid) == Fabric(
        "5a1e2b3c-4d5e-4f60-8172-839405a6b7c8", 1, state=3, status=0, health_mask=HEALTHY_MASK
    )
