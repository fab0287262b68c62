"""The GPU health model: application and disabled XIDs never make a GPU unhealthy; a
critical XID holds until a reset, the opt-in recovery period or a restart; NVML failures
hold for the hold time after NVML answers again."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.core.health import Cause, GpuLost, Holding, NvmlError, NvmlHung, Xids
from agents.core.xid import APPLICATION_XIDS, GpuHealth, HealthPolicy, is_critical

NONE: frozenset[int] = frozenset()


@pytest.mark.parametrize(
    ("xid", "disabled", "critical"),
    [
        (79, NONE, True),
        (48, NONE, True),
        (13, NONE, False),
        (31, NONE, False),
        (43, NONE, False),
        (45, NONE, False),
        (68, NONE, False),
        (109, NONE, False),
        (79, frozenset({79}), False),
        (79, frozenset({48}), True),
    ],
    ids=[
        "fallen-off-bus-xid-is-critical",
        "double-bit-ecc-is-critical",
        "graphics-engine-exception-is-application",
        "mmu-fault-is-application",
        "reset-channel-is-application",
        "preemptive-cleanup-is-application",
        "video-processor-exception-is-application",
        "ctxsw-timeout-is-application",
        "disabled-xid-is-not-critical",
        "other-disabled-xid-leaves-it-critical",
    ],
)
def test_is_critical(xid: int, disabled: frozenset[int], critical: bool) -> None:
    assert is_critical(xid, disabled) is critical


# Steps at times t: ("xid", t, code) an XID event; ("ok", t) a normal NVML answer;
# ("lost"/"hung"/"error", t) an abnormal one; ("?", t, cause) checks the cause then.
Step = tuple[object, ...]
HOLD = 5.0
ERROR = NvmlError("Unknown")
FAILING: dict[object, Cause] = {"lost": GpuLost(), "hung": NvmlHung(), "error": ERROR}

HEALTH_CASES = [
    pytest.param([("?", 0, None)], None, id="healthy-until-told-otherwise"),
    pytest.param([("xid", 0, 79), ("?", 1, Xids((79,)))], None, id="critical-xid-marks-unhealthy"),
    pytest.param(
        [("xid", 0, 13), ("xid", 0, 43), ("?", 0, None)], None, id="application-xids-skipped"
    ),
    pytest.param([("xid", 0, 94), ("?", 0, None)], frozenset({94}), id="disabled-xid-skipped"),
    pytest.param(
        [("xid", 0, 79), ("xid", 0, 48), ("?", 0, Xids((48, 79)))], None, id="xids-named-in-order"
    ),
    pytest.param(
        [("xid", 0, 48), *(("ok", t) for t in range(1, 1000, 100)), ("?", 1000, Xids((48,)))],
        None,
        id="xid-holds-while-nvml-answers-without-recovery-period",
    ),
    pytest.param(
        [
            ("xid", 0, 79),
            ("lost", 1),
            ("?", 1, GpuLost()),
            ("ok", 2),
            ("?", 2, Holding()),
            ("?", 2 + HOLD, None),
        ],
        None,
        id="lost-then-answering-is-a-reset-that-clears-xids-after-the-hold",
    ),
    pytest.param(
        [
            ("error", 0),
            ("?", 0, ERROR),
            ("ok", 1),
            ("?", 1 + HOLD - 0.1, Holding()),
            ("?", 1 + HOLD, None),
        ],
        None,
        id="transient-error-unhealthy-then-healthy-after-hold",
    ),
    pytest.param(
        [("hung", 0), ("?", 0, NvmlHung()), ("ok", 30), ("?", 30 + HOLD, None)],
        None,
        id="hung-gpu-unhealthy-until-answering-for-the-hold",
    ),
    pytest.param(
        [
            ("error", 0),
            ("ok", 1),
            ("error", 3),
            ("ok", 4),
            ("?", 1 + HOLD, Holding()),
            ("?", 4 + HOLD, None),
        ],
        None,
        id="a-new-failure-restarts-the-hold",
    ),
    pytest.param(
        [("xid", 0, 48), ("error", 1), ("ok", 2), ("?", 2, Xids((48,)))],
        None,
        id="an-error-is-no-reset",
    ),
]


def _run(steps: list[Step], health: GpuHealth) -> None:
    for kind, t, *rest in steps:
        assert isinstance(t, int | float)
        if kind == "xid":
            health.xid("A", int(rest[0]), t)  # type: ignore[call-overload]
        elif kind == "ok":
            health.answered("A", t, None)
        elif kind in FAILING:
            health.answered("A", t, FAILING[str(kind)])
        else:
            assert health.cause("A", t) == rest[0], (kind, t)


@pytest.mark.parametrize(("steps", "disabled"), HEALTH_CASES)
def test_health_model(steps: list[Step], disabled: frozenset[int] | None) -> None:
    _run(steps, GpuHealth(HealthPolicy(disabled or NONE, hold_s=HOLD)))


@pytest.mark.parametrize(
    ("steps", "cause"),
    [
        pytest.param([("xid", 0, 79), ("ok", 5)], None, id="recovers-after-the-period"),
        pytest.param(
            [("xid", 0, 79), ("ok", 5), ("xid", 50, 79)], Xids((79,)), id="new-xid-restarts"
        ),
        pytest.param(
            [("xid", 0, 79), ("error", 55), ("ok", 56)], Xids((79,)), id="nvml-failure-restarts"
        ),
    ],
)
def test_xid_recovery_period(steps: list[Step], cause: Cause | None) -> None:
    health = GpuHealth(HealthPolicy(NONE, xid_recovery_s=60, hold_s=0))
    _run([*steps, ("?", 100, cause)], health)


def test_health_is_per_gpu() -> None:
    health = GpuHealth(HealthPolicy())
    health.xid("A", 79, 0)
    health.answered("B", 0, GpuLost())
    assert (health.cause("A", 1), health.cause("B", 1), health.cause("C", 1)) == (
        Xids((79,)),
        GpuLost(),
        None,
    )


xids = st.frozensets(st.integers(0, 200) | st.sampled_from(sorted(APPLICATION_XIDS)))


@given(xids, xids)
def test_healthy_iff_every_delivered_xid_is_ignored(
    delivered: frozenset[int], disabled: frozenset[int]
) -> None:
    health = GpuHealth(HealthPolicy(disabled))
    for code in delivered:
        health.xid("A", code, 0)
    ignored = APPLICATION_XIDS | disabled
    assert (health.cause("A", 1) is None) is (delivered <= ignored)
