"""XID policy: application XIDs and disabled XIDs never make a GPU unhealthy."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.core.xid import APPLICATION_XIDS, gpu_healthy, is_critical, unhealthy_reason

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


@pytest.mark.parametrize(
    ("lost", "pending", "disabled", "reason"),
    [
        (False, NONE, NONE, None),
        (True, NONE, NONE, "lost"),
        (True, frozenset({79}), NONE, "lost"),
        (False, frozenset({79}), NONE, "xid=79"),
        (False, frozenset({79, 48, 13}), NONE, "xid=48,79"),
        (False, frozenset({13, 43}), NONE, None),
        (False, frozenset({94}), frozenset({94}), None),
    ],
    ids=[
        "nothing-pending-is-healthy",
        "lost-is-unhealthy",
        "lost-wins-over-xids",
        "critical-xid-is-named",
        "critical-xids-named-in-order-without-application-ones",
        "application-xids-only-is-healthy",
        "disabled-xid-only-is-healthy",
    ],
)
def test_unhealthy_reason_and_health_agree(
    lost: bool, pending: frozenset[int], disabled: frozenset[int], reason: str | None
) -> None:
    assert unhealthy_reason(lost, pending, disabled) == reason
    assert gpu_healthy(lost, pending, disabled) is (reason is None)


xids = st.frozensets(st.integers(0, 200) | st.sampled_from(sorted(APPLICATION_XIDS)))


@given(st.booleans(), xids, xids)
def test_healthy_iff_not_lost_and_every_pending_xid_is_ignored(
    lost: bool, pending: frozenset[int], disabled: frozenset[int]
) -> None:
    ignored = APPLICATION_XIDS | disabled
    assert gpu_healthy(lost, pending, disabled) is (not lost and pending <= ignored)
