"""The NVLink fabric's health as the GPU signal `nvlink-fabric`: each health condition and a
failed registration Degraded with its cause named, Healthy again after the hold on an
injected clock; no fabric, no health reported or an odd value never Degraded."""

from __future__ import annotations

import pynvml
import pytest

from agents.core.degraded import NOT_OFFERED, Limits, Unknown
from agents.core.fabric_health import (
    HEALTHY_MASK,
    INCORRECT_CONFIGURATIONS,
    YES_NO,
    health_mask,
    judge_fabric,
)
from agents.core.gfd_facts import Fabric
from agents.core.gpu_signals import GpuReading, GpuSignals

CLUSTER = "5a1e2b3c-4d5e-4f60-8172-839405a6b7c8"
HOLD_S = 60.0


def fabric(mask: int = HEALTHY_MASK, state: int = 3, status: int = 0) -> Fabric:
    return Fabric(CLUSTER, 1, state=state, status=status, health_mask=mask)


@pytest.mark.parametrize(
    ("mask", "message", "conditions"),
    [
        (0x1A9, "degraded bandwidth", "degradedBandwidth"),  # 1 << 0 in place of 2 << 0
        (0x1A6, "route recovery", "routeRecovery"),  # 1 << 2
        (0x19A, "route unhealthy", "routeUnhealthy"),  # 1 << 4
        (0x16A, "access timeout recovery", "accessTimeoutRecovery"),  # 1 << 6
        (0x2AA, "incorrect configuration (incorrect SysGUID)", "incorrectSysguid"),
        (0x3AA, "incorrect configuration (incorrect chassis serial number)", None),
        (0x4AA, "incorrect configuration (no partition)", "noPartition"),
        (0x5AA, "incorrect configuration (insufficient NVLinks)", None),
        (0x6AA, "incorrect configuration (incompatible GPU firmware)", None),
        (0x7AA, "incorrect configuration (invalid location)", None),
        (0x8AA, "incorrect configuration (GPU state invalid)", None),
        (
            0x599,
            "degraded bandwidth, route unhealthy, incorrect configuration (insufficient NVLinks)",
            "degradedBandwidth,routeUnhealthy,insufficientNvlinks",
        ),
    ],
    ids=[
        *("bandwidth", "route-recovery", "route-unhealthy", "access-timeout", "sysguid"),
        *("chassis-sn", "no-partition", "nvlinks", "firmware", "location", "gpu-state"),
        "three-at-once",
    ],
)
def test_each_health_condition_is_degraded_with_its_cause_named(
    mask: int, message: str, conditions: str | None
) -> None:
    verdicts, unknown = judge_fabric(fabric(mask))
    assert unknown == []
    [verdict] = verdicts
    assert (verdict.signal, verdict.level) == ("nvlink-fabric", "degraded")
    assert verdict.message == f"NVLink fabric: {message}"
    figures = dict(verdict.figures)
    assert figures["healthMask"] == mask
    if conditions is not None:
        assert figures["conditions"] == conditions


@pytest.mark.parametrize(
    ("status", "named"),
    [(27, "NotReady"), (10, "Timeout"), (999, "Unknown"), (42, "42")],
    ids=["not-ready", "timeout", "unknown", "a-number-nvml-has-no-name-for-here"],
)
def test_a_failed_registration_is_degraded_with_nvmls_status(status: int, named: str) -> None:
    [verdict] = judge_fabric(fabric(status=status))[0]
    assert verdict.message == f"NVLink fabric: registration failed (NVML status {named})"
    assert dict(verdict.figures) == {"status": status}


@pytest.mark.parametrize(
    "odd",
    [
        fabric(state=2, status=27),  # still registering: the label waits, nothing failed
        fabric(state=1, status=0),
        fabric(mask=0),  # a driver that reports no health
        fabric(mask=0x1AA | 0xC000),  # GFM state and partition: not judged
    ],
    ids=["in-progress", "not-started", "no-health-reported", "other-fields"],
)
def test_a_fabric_that_has_not_failed_is_within_limits(odd: Fabric) -> None:
    assert judge_fabric(odd) == ([], [])


@pytest.mark.parametrize(
    ("mask", "why"),
    [(0x1AB, "degradedBandwidth 3"), (0x9AA, "incorrectConfiguration 9")],
    ids=["yes-no-value-3", "configuration-value-9"],
)
def test_a_value_nvml_has_not_defined_is_unknown_not_degraded(mask: int, why: str) -> None:
    assert judge_fabric(fabric(mask)) == (
        [],
        [Unknown("nvlink-fabric", f"health mask {mask:#x}: {why}")],
    )


def test_a_gpu_without_fabric_has_the_signal_unknown_never_degraded() -> None:
    assert judge_fabric(None) == ([], [Unknown("nvlink-fabric", NOT_OFFERED)])


def test_the_masks_layout_is_nvmls() -> None:
    """Shifts and values as nvml.h (and pynvml) define NVML_GPU_FABRIC_HEALTH_MASK_*."""
    shifts = {
        "degradedBandwidth": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW,
        "routeRecovery": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_RECOVERY,
        "routeUnhealthy": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY,
        "accessTimeoutRecovery": pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ACCESS_TIMEOUT_RECOVERY,
    }
    assert {name: shift for name, (shift, _) in YES_NO.items()} == shifts
    shift = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_INCORRECT_CONFIGURATION
    assert health_mask(("noPartition",)) >> shift == (
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NO_PARTITION
    )
    assert INCORRECT_CONFIGURATIONS["gpuStateInvalid"][0] == (
        pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_GPU_STATE_INVALID
    )
    false = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE
    none = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_INCORRECT_CONFIGURATION_NONE
    assert HEALTHY_MASK == sum(false << s for s in shifts.values()) | none << shift == 0x1AA


def test_a_health_fault_holds_until_the_hold_then_healthy() -> None:
    now = [1000.0]
    signals = GpuSignals(Limits(hold_s=HOLD_S), lambda: now[0])
    well, faulty = GpuReading(fabric=fabric()), GpuReading(fabric=fabric(0x19A))
    assert signals.observe(well).level == "healthy"
    now[0] += 5
    out = signals.observe(faulty)
    assert (out.level, out.message) == ("degraded", "NVLink fabric: route unhealthy")
    now[0] += 5  # the fault is gone: held
    held = signals.observe(well)
    assert held.level == "degraded" and [s.held for s in held.signals] == [True]
    now[0] += HOLD_S - 5 - 0.001
    assert signals.observe(well).level == "degraded"
    now[0] += 0.001  # holdS since the last probe that found it
    assert signals.observe(well).signals == ()
