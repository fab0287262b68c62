"""The real NVML backend where no GPU is present, and its pure XID and MIG-name helpers."""

from __future__ import annotations

import pynvml
import pytest

from agents.core.mig import mig_profile_name
from agents.core.xid import PendingXids
from agents.errors import BackendError
from agents.hw.nvml_backend import NvmlBackend


def _nvml_present() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


no_nvml = pytest.mark.skipif(_nvml_present(), reason="libnvidia-ml is present here")


@no_nvml
def test_init_without_nvml_raises_backend_error_not_pynvml_error() -> None:
    with pytest.raises(BackendError, match=r"^NVML unavailable: ") as info:
        NvmlBackend().init()
    assert isinstance(info.value.__cause__, pynvml.NVMLError)


def test_shutdown_without_init_is_a_no_op_and_safe_twice() -> None:
    backend = NvmlBackend()
    backend.shutdown()
    backend.shutdown()


@no_nvml
def test_queries_before_init_raise_backend_error() -> None:
    backend = NvmlBackend()
    with pytest.raises(BackendError):
        backend.gpus()
    with pytest.raises(BackendError):
        backend.driver_version()
    with pytest.raises(BackendError):
        backend.status("GPU-0")


async def test_next_events_before_init_raises_backend_error() -> None:
    with pytest.raises(BackendError, match="not initialised"):
        await NvmlBackend().next_events(0.01)


# Steps: ("xid", uuid, xid) delivers an XID; ("seen", uuid, lost) is a status() reading.
PENDING_CASES = [
    pytest.param([("xid", "A", 79), ("seen", "A", False)], {"A": {79}}, id="delivered-stays"),
    pytest.param([("xid", "A", 13), ("xid", "A", 43)], {"A": set()}, id="ignored-never-kept"),
    pytest.param([("xid", "A", 79), ("seen", "A", True)], {"A": {79}}, id="kept-while-lost"),
    pytest.param(
        [("xid", "A", 79), ("seen", "A", True), ("seen", "A", False)],
        {"A": set()},
        id="cleared-by-reset",
    ),
    pytest.param(
        [("xid", "A", 79), ("seen", "A", True), ("seen", "A", False), ("xid", "A", 48)],
        {"A": {48}},
        id="pending-again-after-reset",
    ),
    pytest.param(
        [("xid", "A", 79), ("xid", "B", 48), ("seen", "B", True), ("seen", "B", False)],
        {"A": {79}, "B": set()},
        id="per-gpu",
    ),
    pytest.param(
        [("xid", "A", 79), ("xid", "A", 79), ("xid", "A", 94)], {"A": {79, 94}}, id="set-of-xids"
    ),
]


@pytest.mark.parametrize(("steps", "expected"), PENDING_CASES)
def test_pending_xids_bookkeeping(
    steps: list[tuple[str, str, object]], expected: dict[str, set[int]]
) -> None:
    pending = PendingXids(ignored=frozenset({13, 43}))
    for kind, uuid, value in steps:
        if kind == "xid":
            assert isinstance(value, int)
            pending.deliver(uuid, value)
        else:
            assert isinstance(value, bool)
            pending.observe(uuid, value)
    assert {uuid: set(pending.pending(uuid)) for uuid in expected} == expected


def test_observe_reports_a_reset_only_on_the_way_back_from_lost() -> None:
    pending = PendingXids()
    assert [pending.observe("A", lost) for lost in (False, True, True, False, False)] == [
        False,
        False,
        False,
        True,
        False,
    ]


@pytest.mark.parametrize(
    ("gi", "ci", "memory_mib", "gpu_bytes", "name"),
    [
        pytest.param(1, 1, 9856, 81559 * 2**20, "1g.10gb", id="h100-1g"),
        pytest.param(1, 1, 19968, 81559 * 2**20, "1g.20gb", id="h100-1g-20"),
        pytest.param(3, 3, 40192, 81559 * 2**20, "3g.40gb", id="h100-3g"),
        pytest.param(7, 7, 80896, 81559 * 2**20, "7g.80gb", id="h100-7g"),
        pytest.param(1, 1, 4864, 40536 * 2**20, "1g.5gb", id="a100-40-1g"),
        pytest.param(2, 2, 9984, 40536 * 2**20, "2g.10gb", id="a100-40-2g"),
        pytest.param(2, 1, 19968, 81559 * 2**20, "1c.2g.20gb", id="compute-slice"),
    ],
)
def test_mig_profile_name(gi: int, ci: int, memory_mib: int, gpu_bytes: int, name: str) -> None:
    assert mig_profile_name(gi, ci, memory_mib, gpu_bytes) == name
