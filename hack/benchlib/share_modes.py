"""Each shared GPU's compute mode as the agent's log tells it (`gpu_compute_mode_set`): the
simulator keeps the mode in the agent's memory, so its JSON log lines are the one view of
it from outside."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from hack.benchlib.figures import Figure, skipped

EVENT = "gpu_compute_mode_set"
EXCLUSIVE = "EXCLUSIVE_PROCESS"
DEFAULT = "DEFAULT"
AT_PEAK = "GPUs in EXCLUSIVE_PROCESS at each peak"
AFTER = "GPUs not in DEFAULT compute mode after a cycle"


def modes_at(log: Path, start: int, marks: Sequence[int]) -> tuple[list[dict[str, str]], int]:
    """Each GPU's mode (those never set: DEFAULT, left out) at each byte offset of `marks`
    (ascending) of the agent's log, read from `start` (the agent's start); and how many
    times the log shows a mode set."""
    modes: dict[str, str] = {}
    snapshots: list[dict[str, str]] = []
    sets = 0
    with log.open("rb") as lines:
        lines.seek(start)
        at = start
        pending = list(marks)
        for line in lines:
            while pending and at >= pending[0]:
                snapshots.append(dict(modes))
                pending.pop(0)
            at += len(line)
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict) and record.get("event") == EVENT:
                modes[str(record["gpu"])] = str(record["mode"])
                sets += 1
        snapshots += [dict(modes) for _ in pending]
    return snapshots, sets


def compute_mode_figures(
    log: Path, start: int, peaks: Sequence[int], ends: Sequence[int], gpus: int
) -> list[Figure]:
    """At each peak (log offsets `peaks`) the `gpus` shared GPUs in EXCLUSIVE_PROCESS; after
    each cycle (`ends`) none left in another mode than DEFAULT. Skipped where the agent
    logs no mode set at all: a build that does not set them."""
    snapshots, sets = modes_at(log, start, sorted([*peaks, *ends]))
    by_mark = dict(zip(sorted([*peaks, *ends]), snapshots, strict=True))
    if sets == 0:
        why = (
            "not measurable yet: the agent set no compute mode for shares (no "
            f"{EVENT} in its log; EXCLUSIVE_PROCESS while shares are held is not in this build)"
        )
        return [skipped(AT_PEAK, str(gpus), why), skipped(AFTER, "0", why)]

    def count(mark: int, exclusive: bool) -> int:
        return sum((m == EXCLUSIVE) == exclusive for m in by_mark[mark].values() if m != DEFAULT)

    at_peak = [count(m, True) for m in peaks]
    left = [sum(m != DEFAULT for m in by_mark[e].values()) for e in ends]
    note = (
        f"from the agent's log ({EVENT}): {sets} modes set since its start, at each peak "
        f"{', '.join(map(str, at_peak))}, after each cycle {', '.join(map(str, left))} not "
        "DEFAULT; the simulated NVML keeps them in the agent's memory"
    )
    return [
        Figure(AT_PEAK, float(min(at_peak)), "", str(gpus), all(n == gpus for n in at_peak), note),
        Figure(AFTER, float(max(left)), "", "0", not any(left)),
    ]
