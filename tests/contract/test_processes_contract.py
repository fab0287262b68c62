"""A GPU's running processes answered alike by the simulator and by the real backend over
the test NVML library, for the same node file: each GPU's list (none, one, several), the
memory in bytes, and an error for a GPU whose NVML fails. The real backend also merges
MPS clients and reads NVML's "not available" memory as unknown."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

from agents.errors import BackendError
from agents.hw.nvml import GpuProcesses
from agents.sim.bundled import bundled_node
from agents.sim.node import parse_node
from agents.sim.nvml import SimNvml
from tests.nvml.library import nvml_env
from tests.nvml.nodes import REPO, from_sim_node
from tests.nvml.state import NvmlNode, Process

REAL = """
import json, sys
from agents.hw.nvml_backend import NvmlBackend
from tests.contract.test_processes_contract import answers
nvml = NvmlBackend()
nvml.init()
nvml.gpus()
print(json.dumps(answers(nvml, sys.argv[1:])))
"""


def node_text() -> str:
    """The bundled 8-GPU node: GPU 0 runs two processes, GPU 1 one, GPU 2 fails."""
    doc = yaml.safe_load(bundled_node("h100-8gpu-8nic").read_text())
    doc["gpus"][0]["processes"] = [
        {"pid": 4242, "usedMemoryMiB": 10240},
        {"pid": 77, "usedMemoryMiB": 0},
    ]
    doc["gpus"][1]["processes"] = [{"pid": 4194304, "usedMemoryMiB": 81559}]
    doc["gpus"][2]["nvml"] = {"error": "Unknown"}
    return yaml.safe_dump(doc)


def answers(nvml: GpuProcesses, uuids: list[str]) -> list[object]:
    """Each GPU's processes as (pid, bytes), or "error"."""
    out: list[object] = []
    for uuid in uuids:
        try:
            out.append([[p.pid, p.used_bytes] for p in nvml.processes(uuid)])
        except BackendError:
            out.append("error")
    return out


def real_answers(tmp_path: Path, state: NvmlNode) -> list[object]:
    state.write(tmp_path / "state")
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(REAL), *(g.uuid for g in state.gpus)],
        cwd=REPO,
        env=nvml_env(tmp_path / "state"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: list[object] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_real_and_simulated_backends_list_a_gpus_processes_alike(tmp_path: Path) -> None:
    node = parse_node(node_text(), "node.yaml")
    sim = SimNvml(node)
    sim.init()
    simulated = answers(sim, [g.uuid for g in node.gpus])
    assert simulated[:4] == [[[4242, 10 * 2**30], [77, 0]], [[4194304, 81559 * 2**20]], "error", []]
    assert real_answers(tmp_path, from_sim_node(node)) == simulated


def test_the_real_backend_merges_mps_clients_and_reads_unknown_memory(tmp_path: Path) -> None:
    state = from_sim_node(parse_node(node_text(), "node.yaml"))
    state.gpus[3].processes = [
        Process(900, None),  # the MPS server, as a compute process
        Process(901, 2**30, mps=True),
        Process(902, None, mps=True),
        Process(900, 5, mps=True),
    ]
    assert real_answers(tmp_path, state)[3] == [[900, 5], [901, 2**30], [902, None]]
