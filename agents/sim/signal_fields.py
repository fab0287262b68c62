"""The degraded-device fields of a simulated node file (docs/degraded.md): a GPU's PCIe
link, utilization, NVLinks down, clock events and memory repairs; a NIC's speed and
counters. Each is optional and answers as healthy hardware does when left out."""

from __future__ import annotations

import re
from dataclasses import dataclass

from agents.sim.fields import Fields, MappingValue

_COUNTER_NAME = r"[a-z][a-z0-9_]{0,63}"


@dataclass(frozen=True)
class PcieSpec:
    """`pcie:` of a GPU; a field left out answers as a healthy link of its model."""

    width: int | None = None
    max_width: int | None = None
    gen: int | None = None
    max_gen: int | None = None
    replays: int = 0


CLOCK_EVENT_NAMES = ("hwSlowdown", "hwThermalSlowdown", "hwPowerBrake")
TELEMETRY_KEYS = ("memoryUsedMiB", "powerWatts", "temperature", "smClockMHz")


@dataclass(frozen=True)
class TelemetrySpec:
    """A GPU's memory in use, power, temperature and SM clock; left out, an idle GPU's."""

    memory_used_mib: int = 0
    power_watts: float = 70.0
    temperature_celsius: int = 30
    sm_clock_mhz: int = 1980


def pcie(f: Fields, m: MappingValue, path: str) -> PcieSpec:
    """`pcie: {width, maxWidth, gen, maxGen, replays}`: the GPU's link as NVML reports it."""
    if m.get("pcie") is None:
        return PcieSpec()
    p = f"{path}.pcie"
    doc = f.mapping(m["pcie"], p, {"width", "maxWidth", "gen", "maxGen", "replays"})
    return PcieSpec(
        width=f.optional_int(doc, p, "width", None),
        max_width=f.optional_int(doc, p, "maxWidth", None),
        gen=f.optional_int(doc, p, "gen", None),
        max_gen=f.optional_int(doc, p, "maxGen", None),
        replays=f.integer(doc, p, "replays", 0, minimum=0),
    )


def percent(f: Fields, m: MappingValue, path: str, key: str) -> int:
    value = f.integer(m, path, key, 0, minimum=0)
    if value > 100:
        f.fail(f"{path}.{key}", "a percentage from 0 to 100")
    return value


def clock_events(f: Fields, m: MappingValue, path: str) -> tuple[str, ...]:
    names = f.strings(m, path, "clockEvents")
    for i, name in enumerate(names):
        if name not in CLOCK_EVENT_NAMES:
            f.fail(f"{path}.clockEvents[{i}]", " or ".join(CLOCK_EVENT_NAMES))
    return tuple(dict.fromkeys(names))


def remapped_rows(f: Fields, m: MappingValue, path: str) -> tuple[bool, bool]:
    """`remappedRows: {pending, failed}`."""
    if m.get("remappedRows") is None:
        return False, False
    p = f"{path}.remappedRows"
    doc = f.mapping(m["remappedRows"], p, {"pending", "failed"})
    return f.boolean(doc, p, "pending", False), f.boolean(doc, p, "failed", False)


def counters(f: Fields, m: MappingValue, path: str) -> tuple[tuple[str, int], ...]:
    """`counters: {symbol_error: 0, ...}`: RDMA counter files and their values."""
    if m.get("counters") is None:
        return ()
    p = f"{path}.counters"
    doc = m["counters"]
    if not isinstance(doc, dict):
        f.fail(p, "a mapping of counter name to value")
    out: list[tuple[str, int]] = []
    for name in doc:
        if not isinstance(name, str) or re.fullmatch(_COUNTER_NAME, name) is None:
            f.fail(f"{p}.{name}", "a counter name such as symbol_error")
        out.append((name, f.integer(doc, p, name, 0, minimum=0)))
    return tuple(sorted(out))


def telemetry(f: Fields, m: MappingValue, path: str) -> TelemetrySpec:
    """`memoryUsedMiB`, `powerWatts`, `temperature` (Celsius), `smClockMHz` of a GPU."""
    idle = TelemetrySpec()
    power = m.get("powerWatts", idle.power_watts)
    if isinstance(power, bool) or not isinstance(power, int | float) or power < 0:
        f.fail(f"{path}.powerWatts", "a number of watts >= 0")
    return TelemetrySpec(
        memory_used_mib=f.integer(m, path, "memoryUsedMiB", idle.memory_used_mib, minimum=0),
        power_watts=float(power),
        temperature_celsius=f.integer(m, path, "temperature", idle.temperature_celsius),
        sm_clock_mhz=f.integer(m, path, "smClockMHz", idle.sm_clock_mhz, minimum=0),
    )
