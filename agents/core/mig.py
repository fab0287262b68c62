"""MIG profile names, as the driver names the GPU-instance profiles."""

from __future__ import annotations

import math


def mig_profile_name(gi_slices: int, ci_slices: int, memory_mib: int, gpu_memory_bytes: int) -> str:
    """The MIG profile name ("1g.10gb", "1c.2g.20gb") of an instance with these attributes.

    NVML reports the instance's exact memory; profile names round it to eighths of the
    GPU's memory in whole GB, the way the driver's own profile names do.
    """
    gib = 2**30
    fraction = math.ceil(memory_mib * 2**20 / gpu_memory_bytes * 8) / 8
    total_gb = -(-gpu_memory_bytes // gib)
    name = f"{gi_slices}g.{round(fraction * total_gb)}gb"
    return name if ci_slices >= gi_slices else f"{ci_slices}c.{name}"
