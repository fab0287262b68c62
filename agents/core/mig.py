"""MIG profile names, as the driver names the GPU-instance profiles."""

from __future__ import annotations

import math
import re


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


_PROFILE = re.compile(r"(?:\d+c\.)?(\d+)g\.(\d+)gb(\+me)?")
# NVML's GPU instance profile IDs (nvmlGpuInstanceProfileInfo_t.id) by compute slices, the
# same on every MIG-capable model; one-slice profiles depend on memory and media engines.
_GI_PROFILE_IDS = {2: 14, 3: 9, 4: 5, 7: 0}
_ONE_SLICE_IDS = {1: 19, 2: 15}  # by memory slices: 1g.10gb and 1g.20gb on an 80 GB GPU
_ONE_SLICE_MEDIA_ID = 20  # 1g.10gb+me
# Memory slices (of 8) a GPU instance of more than one compute slice spans.
_MEMORY_SLICES = {2: 2, 3: 4, 4: 4, 7: 8}


def gi_profile(profile: str, gpu_memory_bytes: int) -> tuple[int, int]:
    """(NVML's GPU instance profile ID, memory slices it spans) of a profile name, on a
    GPU of that memory: 1g.10gb on an 80 GB GPU is (19, 1), 3g.40gb is (9, 4)."""
    match = _PROFILE.fullmatch(profile)
    if match is None:
        raise ValueError(f"not a MIG profile name: {profile}")
    gi, gb, media = int(match[1]), int(match[2]), bool(match[3])
    if gi != 1:
        return _GI_PROFILE_IDS[gi], _MEMORY_SLICES[gi]
    total_gb = max(-(-gpu_memory_bytes // 2**30), 1)
    memory_slices = min(max(round(gb * 8 / total_gb), 1), 2)
    return (_ONE_SLICE_MEDIA_ID if media else _ONE_SLICE_IDS[memory_slices]), memory_slices
