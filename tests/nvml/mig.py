"""MIG as the test NVML library answers it: profile names, the GPU instance profiles a
MIG-capable GPU offers (NVML_GPU_INSTANCE_PROFILE_* index, profile ID, slices, memory),
GPU instance IDs and placements, compute instance profiles."""

from __future__ import annotations

import re
from dataclasses import dataclass

_NAME = re.compile(r"(?:(\d+)c\.)?(\d+)g\.(\d+)gb(\+me)?")
# The memory (MiB) NVML reports for each GPU-instance size, by the GPU's memory in GB: what
# the driver gives on A100 40GB and H100/A100 80GB. Other sizes: scaled from memory slices.
_MEMORY_MIB = {
    40: {1: 4864, 2: 9984, 3: 19968, 4: 19968, 7: 40192},
    80: {1: 9856, 2: 19968, 3: 40192, 4: 40192, 7: 80384},
}
# GPU instance IDs the driver gives each GPU-instance size, in order of placement.
_GI_IDS = {7: [0], 4: [1], 3: [1, 2], 2: [3, 4, 5], 1: list(range(7, 15))}
MEMORY_SLICES = 8  # of a MIG-capable GPU's memory; 7 compute slices
# Memory slices each GPU-instance size occupies, and where it may start (first fit).
_SIZE = {1: 1, 2: 2, 3: 4, 4: 4, 7: 8}
_STARTS = {1: list(range(7)), 2: [0, 2, 4], 3: [4, 0], 4: [0], 7: [0]}
SM_PER_SLICE = 14


@dataclass(frozen=True)
class GiProfile:
    """One NVML_GPU_INSTANCE_PROFILE_*: its index, the driver's profile ID, compute slices,
    how many fit on an empty GPU, and whether it has the media engines (+me)."""

    index: int
    id: int
    slices: int
    instances: int
    media: bool = False


# The base profiles and 1g+me, with the IDs the driver gives them (nvidia-smi mig -lgip).
GI_PROFILES = (
    GiProfile(0, 19, 1, 7),
    GiProfile(1, 14, 2, 3),
    GiProfile(2, 9, 3, 2),
    GiProfile(3, 5, 4, 1),
    GiProfile(4, 0, 7, 1),
    GiProfile(7, 20, 1, 1, media=True),
)
# NVML_COMPUTE_INSTANCE_PROFILE_* index (= its profile ID) by compute slices.
CI_PROFILE = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}


def parse(profile: str) -> tuple[int, int, int, bool]:
    """(compute slices, GPU slices, GB, +me) of a profile name like 1g.10gb or 1c.2g.20gb."""
    match = _NAME.fullmatch(profile)
    if match is None:
        raise ValueError(f"not a MIG profile name: {profile}")
    gi = int(match[2])
    return int(match[1] or gi), gi, int(match[3]), bool(match[4])


def gi_profile(profile: str) -> GiProfile:
    """The GPU instance profile an instance of this name is made from."""
    _, gi, _, media = parse(profile)
    return next(p for p in GI_PROFILES if p.slices == gi and p.media == (media and gi == 1))


def memory_mib(gi_slices: int, total_bytes: int) -> int:
    """Memory of a GPU instance of that size on a GPU of that memory."""
    total_gb = -(-total_bytes // 2**30)
    known = _MEMORY_MIB.get(total_gb, {})
    if gi_slices in known:
        return known[gi_slices]
    share = _SIZE[gi_slices] / MEMORY_SLICES
    return int(share * total_bytes / 2**20 * 0.96)  # what a slice keeps, about


def named_memory_mib(profile: str, total_bytes: int) -> int:
    """Memory of an instance by its name: the known figure, else the GB the name says."""
    _, gi, gb, _ = parse(profile)
    total_gb = -(-total_bytes // 2**30)
    known = _MEMORY_MIB.get(total_gb, {})
    if gi in known:
        return known[gi]
    return int(gb / total_gb * total_bytes / 2**20 * 0.96)


def next_gi_id(gi_slices: int, taken: set[int]) -> int:
    return next(i for i in _GI_IDS[gi_slices] if i not in taken)


def place(gi_slices: int, used: set[int]) -> tuple[int, int]:
    """(start, size) in memory slices: the first placement of the size that is free; the
    size's first placement where none is (a layout no GPU could hold)."""
    size = _SIZE[gi_slices]
    for start in _STARTS[gi_slices]:
        span = set(range(start, start + size))
        if not span & used:
            used |= span
            return start, size
    return _STARTS[gi_slices][0], size
