"""The processes running on one GPU, read through pynvml: its compute processes and, where
the driver offers the call, its MPS clients, one entry per PID."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pynvml

from agents.hw.nvml import GpuProcess
from agents.hw.nvml_query import code

# What a driver without MPS client listing answers (before R470, or none on this GPU).
_NO_MPS_LISTING = (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_NOT_SUPPORTED)


def running_processes(lib: Any, handle: object) -> tuple[GpuProcess, ...]:
    """Blocking: the GPU's compute processes (nvmlDeviceGetComputeRunningProcesses, v3
    through pynvml) and MPS clients (nvmlDeviceGetMPSComputeRunningProcesses), merged by
    PID. Raises what pynvml raises; a driver without the MPS call lists compute processes
    only."""
    listed = list(lib.nvmlDeviceGetComputeRunningProcesses(handle))
    mps_call = getattr(lib, "nvmlDeviceGetMPSComputeRunningProcesses", None)
    if mps_call is not None:
        try:
            listed.extend(mps_call(handle))
        except pynvml.NVMLError as exc:
            if code(exc) not in _NO_MPS_LISTING:
                raise
    return merged(GpuProcess(int(p.pid), _bytes(p.usedGpuMemory)) for p in listed)


def merged(processes: Iterable[GpuProcess]) -> tuple[GpuProcess, ...]:
    """One entry per PID, in the order first listed: a PID both calls list (an MPS client
    is also a compute process on some drivers) keeps the larger memory it is given."""
    by_pid: dict[int, GpuProcess] = {}
    for process in processes:
        before = by_pid.get(process.pid)
        if before is None or before.used_bytes is None:
            used = process.used_bytes
        else:
            used = max(before.used_bytes, process.used_bytes or 0)
        by_pid[process.pid] = GpuProcess(process.pid, used)
    return tuple(by_pid.values())


def _bytes(value: object) -> int | None:
    """pynvml's usedGpuMemory: None where NVML answered NVML_VALUE_NOT_AVAILABLE (pynvml
    turns it into None; an older pynvml leaves the all-ones value itself)."""
    if value is None:
        return None
    number = int(value)  # type: ignore[call-overload]
    return None if number >= pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value else number
