"""`processes:` of a simulated GPU: the processes its NVML lists as running on it, each
with the GPU memory it uses; editable while the agent runs, as processes come and go."""

from __future__ import annotations

from agents.sim.fields import Fields, MappingValue
from agents.sim.specs import SimProcess

PID_MAX = 4_194_304  # the kernel's largest pid_max (PID_MAX_LIMIT on 64-bit)


def processes(f: Fields, m: MappingValue, path: str) -> tuple[SimProcess, ...]:
    """`processes: [{pid, usedMemoryMiB}]`: PIDs unique on the GPU, 1 to PID_MAX."""
    out: list[SimProcess] = []
    seen: set[int] = set()
    for i, doc in enumerate(f.items(m, path, "processes")):
        p = f"{path}.processes[{i}]"
        entry = f.mapping(doc, p, {"pid", "usedMemoryMiB"})
        if entry.get("pid") is None:
            f.fail(f"{p}.pid", f"a process ID from 1 to {PID_MAX} (required)")
        pid = f.integer(entry, p, "pid", 0, minimum=1)
        if pid > PID_MAX:
            f.fail(f"{p}.pid", f"a process ID from 1 to {PID_MAX}")
        if pid in seen:
            f.fail(f"{p}.pid", "a process ID not listed before on this GPU")
        seen.add(pid)
        out.append(SimProcess(pid, f.integer(entry, p, "usedMemoryMiB", 0, minimum=0)))
    return tuple(out)
