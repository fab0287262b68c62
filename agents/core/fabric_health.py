"""The NVLink fabric's health as a GPU's degraded-device signal `nvlink-fabric`
(docs/degraded.md): NVML's fabric health mask decoded, and a failed registration."""

from __future__ import annotations

from agents.core.degraded import NOT_OFFERED, SignalVerdict, Unknown
from agents.core.gfd_facts import FABRIC_STATE_COMPLETED, Fabric

SIGNAL = "nvlink-fabric"
# NVML_GPU_FABRIC_HEALTH_MASK_*: each condition's shift and width in the mask. Every
# yes-or-no condition answers NOT_SUPPORTED (0), TRUE (1: the fault) or FALSE (2).
YES_NO = {
    "degradedBandwidth": (0, "degraded bandwidth"),
    "routeRecovery": (2, "route recovery"),
    "routeUnhealthy": (4, "route unhealthy"),
    "accessTimeoutRecovery": (6, "access timeout recovery"),
}
HEALTH_TRUE, HEALTH_FALSE = 1, 2
# The incorrect-configuration condition names which one (0: NOT_SUPPORTED, 1: NONE).
CONFIG_SHIFT, CONFIG_WIDTH, CONFIG_NONE = 8, 0xF, 1
INCORRECT_CONFIGURATIONS = {
    "incorrectSysguid": (2, "incorrect SysGUID"),
    "incorrectChassisSn": (3, "incorrect chassis serial number"),
    "noPartition": (4, "no partition"),
    "insufficientNvlinks": (5, "insufficient NVLinks"),
    "incompatibleGpuFw": (6, "incompatible GPU firmware"),
    "invalidLocation": (7, "invalid location"),
    "gpuStateInvalid": (8, "GPU state invalid"),
}
# What a fabric manager answers for a healthy fabric (as NVIDIA's mock NVML does):
# every yes-or-no condition FALSE, the configuration NONE.
HEALTHY_MASK = sum(HEALTH_FALSE << shift for shift, _ in YES_NO.values()) | (
    CONFIG_NONE << CONFIG_SHIFT
)
# The registration's status is an nvmlReturn_t; its names as NVML's errors have them.
_RETURNS = {3: "NotSupported", 9: "DriverNotLoaded", 10: "Timeout", 15: "GpuIsLost"}
_RETURNS |= {16: "ResetRequired", 19: "InUse", 27: "NotReady", 29: "InvalidState"}
_RETURNS |= {999: "Unknown"}


def health_mask(faults: tuple[str, ...]) -> int:
    """The mask NVML answers with these conditions (YES_NO's names, at most one of
    INCORRECT_CONFIGURATIONS') at fault and every other one healthy."""
    mask = HEALTHY_MASK
    for name in faults:
        if name in YES_NO:
            shift = YES_NO[name][0]
            mask = mask & ~(0x3 << shift) | HEALTH_TRUE << shift
        else:
            value = INCORRECT_CONFIGURATIONS[name][0]
            mask = mask & ~(CONFIG_WIDTH << CONFIG_SHIFT) | value << CONFIG_SHIFT
    return mask


def judge_fabric(fabric: Fabric | None) -> tuple[list[SignalVerdict], list[Unknown]]:
    """`nvlink-fabric`: Degraded while the registration failed or a health condition is
    at fault; unknown for a GPU without fabric and for a value NVML has not defined."""
    if fabric is None:
        return [], [Unknown(SIGNAL, NOT_OFFERED)]
    faults, names, odd = _faults(fabric.health_mask)
    figures: tuple[tuple[str, int | str], ...] = ()
    if fabric.state == FABRIC_STATE_COMPLETED and fabric.status != 0:
        status = _RETURNS.get(fabric.status, str(fabric.status))
        faults.insert(0, f"registration failed (NVML status {status})")
        figures += (("status", fabric.status),)
    unknown = [Unknown(SIGNAL, f"health mask {fabric.health_mask:#x}: {odd}")] if odd else []
    if not faults:
        return [], unknown
    if names:
        figures += (("conditions", ",".join(names)), ("healthMask", fabric.health_mask))
    message = "NVLink fabric: " + ", ".join(faults)
    return [SignalVerdict(SIGNAL, "degraded", message, figures)], unknown


def _faults(mask: int) -> tuple[list[str], list[str], str]:
    """The conditions at fault (operators' words, the names) and what was odd."""
    faults: list[str] = []
    names: list[str] = []
    odd: list[str] = []
    for name, (shift, words) in YES_NO.items():
        value = mask >> shift & 0x3
        if value == HEALTH_TRUE:
            faults.append(words)
            names.append(name)
        elif value not in (0, HEALTH_FALSE):
            odd.append(f"{name} {value}")
    config = mask >> CONFIG_SHIFT & CONFIG_WIDTH
    kinds = {value: (n, w) for n, (value, w) in INCORRECT_CONFIGURATIONS.items()}
    if config in kinds:
        faults.append(f"incorrect configuration ({kinds[config][1]})")
        names.append(kinds[config][0])
    elif config not in (0, CONFIG_NONE):
        odd.append(f"incorrectConfiguration {config}")
    return faults, names, ", ".join(odd)
