"""A GPU's running processes through pynvml's interface (a stand-in of it here): compute
processes and MPS clients merged by PID, NVML's "not available" memory as None, and a
driver without the MPS call answering compute processes alone."""

from __future__ import annotations

from dataclasses import dataclass

import pynvml
import pytest

from agents.errors import BackendError
from agents.hw.nvml import GpuProcess
from agents.hw.nvml_processes import merged, running_processes
from agents.hw.nvml_query import translated

NOT_AVAILABLE = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


@dataclass
class Listed:
    pid: int
    usedGpuMemory: int | None  # noqa: N815 - pynvml's name


class Lib:
    def __init__(self, compute: list[Listed], mps: list[Listed] | int | None) -> None:
        self.compute, self.mps = compute, mps
        if mps is None:
            del self.mps

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list[Listed]:
        return self.compute

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: object) -> list[Listed]:
        if not hasattr(self, "mps"):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        if isinstance(self.mps, int):
            raise pynvml.NVMLError(self.mps)
        return self.mps or []


def test_compute_processes_and_mps_clients_are_one_list_by_pid() -> None:
    lib = Lib(
        [Listed(10, 500), Listed(11, None), Listed(12, NOT_AVAILABLE)],
        [Listed(11, 2048), Listed(20, 4096), Listed(10, None)],
    )
    assert running_processes(lib, object()) == (
        GpuProcess(10, 500),
        GpuProcess(11, 2048),
        GpuProcess(12, None),
        GpuProcess(20, 4096),
    )


@pytest.mark.parametrize(
    "mps",
    [None, pynvml.NVML_ERROR_NOT_SUPPORTED],
    ids=["driver-without-the-call", "not-supported"],
)
def test_a_gpu_without_mps_listing_answers_its_compute_processes(mps: int | None) -> None:
    assert running_processes(Lib([Listed(7, 1)], mps), None) == (GpuProcess(7, 1),)


def test_any_other_failure_is_an_error_that_says_so() -> None:
    failing = Lib([], pynvml.NVML_ERROR_UNKNOWN)
    with (
        pytest.raises(BackendError, match=r"running processes of GPU-1: .*Unknown"),
        translated("running processes of GPU-1"),
    ):
        running_processes(failing, None)


def test_a_pid_listed_twice_keeps_the_larger_known_memory() -> None:
    twice = [GpuProcess(1, 5), GpuProcess(1, 3), GpuProcess(2, None), GpuProcess(2, 4)]
    assert merged(twice) == (GpuProcess(1, 5), GpuProcess(2, 4))
