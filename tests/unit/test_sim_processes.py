"""A simulated GPU's running processes (`gpus[].processes`): read strictly from the node
file, and answered by the simulated NVML as NVML answers, faults included."""

from __future__ import annotations

import pytest

from agents.errors import BackendError, ConfigError
from agents.hw.nvml import GpuProcess
from agents.sim.node import parse_node
from agents.sim.nvml import SimNvml

GPU = 'gpus:\n  - {{uuid: GPU-1, pci: "0000:1b:00.0", processes: {processes}{more}}}\n'


def node(processes: str, more: str = "") -> str:
    return GPU.format(processes=processes, more=more)


def test_each_process_answers_with_its_memory_in_bytes() -> None:
    spec = parse_node(node("[{pid: 7, usedMemoryMiB: 100}, {pid: 9}]"), "n.yaml")
    nvml = SimNvml(spec)
    nvml.init()
    assert nvml.processes("GPU-1") == (GpuProcess(7, 100 * 2**20), GpuProcess(9, 0))


BAD = [
    ("7", "gpus[0].processes", "a list"),
    ("[{usedMemoryMiB: 3}]", "gpus[0].processes[0].pid", "a process ID from 1 to 4194304"),
    ("[{pid: 0}]", "gpus[0].processes[0].pid", "an integer >= 1"),
    ("[{pid: 4194305}]", "gpus[0].processes[0].pid", "a process ID from 1 to 4194304"),
    ("[{pid: 3}, {pid: 3}]", "gpus[0].processes[1].pid", "not listed before"),
    ("[{pid: 3, usedMemoryMiB: -1}]", "gpus[0].processes[0].usedMemoryMiB", ">= 0"),
    ("[{pid: 3, usedMemoryMiB: 1.5}]", "gpus[0].processes[0].usedMemoryMiB", "an integer"),
    ("[{pid: 3, user: 1000}]", "gpus[0].processes[0].user", "one of pid, usedMemoryMiB"),
]


@pytest.mark.parametrize(("value", "key", "expected"), BAD, ids=[b[1] + b[0] for b in BAD])
def test_a_bad_process_list_is_refused_naming_the_key(value: str, key: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_node(node(value), "n.yaml")
    assert caught.value.key == key
    assert expected in caught.value.expected


@pytest.mark.parametrize("error", ["Unknown", "GpuIsLost", "NotSupported"])
def test_a_failing_gpu_answers_no_processes_but_an_error(error: str) -> None:
    spec = parse_node(node("[{pid: 7}]", f", nvml: {{error: {error}}}"), "n.yaml")
    nvml = SimNvml(spec)
    nvml.init()
    with pytest.raises(BackendError, match="running processes of GPU-1"):
        nvml.processes("GPU-1")
