"""Runs `show_topology` in this process and prints, as JSON, what it left behind: open
file descriptors it added, what was closed only by the garbage collector, simulated roots
it made that still exist, whether NVML is still initialised. Run as
`python -m tests.integration.topo_probe [NODE.yaml]`."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

from agents.errors import AgentError
from agents.sim.root import PREFIX
from agents.topo import show_topology


def open_fds() -> dict[int, str]:
    out = {}
    for name in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
    return out


def nvml_initialised() -> bool | None:
    """None when pynvml never loaded a library (the simulated node has none)."""
    import pynvml

    if pynvml.nvmlLib is None:
        return None
    try:
        pynvml.nvmlDeviceGetCount()
    except pynvml.NVMLError_Uninitialized:
        return False
    return True


def main(argv: list[str]) -> dict[str, Any]:
    made: list[str] = []

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event == "os.mkdir" and Path(os.fsdecode(args[0])).name.startswith(PREFIX):
            made.append(os.fsdecode(args[0]))

    sys.addaudithook(audit)
    simulate = Path(argv[0]) if argv else None
    before = open_fds()
    error = None
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        try:
            asyncio.run(show_topology(simulate, None, as_json=True))
        except AgentError as exc:
            error = type(exc).__name__
        gc.collect()
    left = {fd: target for fd, target in open_fds().items() if before.get(fd) != target}
    return {
        "error": error,
        "fds_left": sorted(left.values()),
        "unclosed": [str(w.message) for w in seen if issubclass(w.category, ResourceWarning)],
        "roots_made": sorted(set(made)),
        "roots_left": sorted({root for root in made if os.path.lexists(root)}),
        "nvml_initialised": nvml_initialised(),
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
