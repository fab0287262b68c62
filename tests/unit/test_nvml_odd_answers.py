"""The real NVML backend over a pynvml-like layer that answers what the mock library
cannot: every error code NVML may give, on every query, at start and later. No answer
crashes the backend or hides a GPU; only a GPU without a UUID is left out."""

from __future__ import annotations

import asyncio
import ctypes
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from agents.errors import BackendError
from agents.hw.nvml import NVSWITCH_BUS_ID, XidEvent
from agents.hw.nvml_backend import NvmlBackend
from tests.conditions import async_wait_until

NEW_CODE = 4242  # an error code this pynvml does not know yet
FAILURES = {
    "not-supported": pynvml.NVML_ERROR_NOT_SUPPORTED,
    "no-permission": pynvml.NVML_ERROR_NO_PERMISSION,
    "gpu-is-lost": pynvml.NVML_ERROR_GPU_IS_LOST,
    "unknown": pynvml.NVML_ERROR_UNKNOWN,
    "new-code": NEW_CODE,
}
FIELDS = [
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetName",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkRemoteDeviceType",
    "nvmlDeviceGetNvLinkRemotePciInfo",
]


class FakeLib:
    """Two GPUs answering like an HGX board (NVLinks to NVSwitches) unless `fail` says
    which call fails with which NVML code (for GPU index `on`, or every GPU)."""

    def __init__(self) -> None:
        self.fail: dict[str, int] = {}
        self.on: int | None = None
        self.answers: dict[str, object] = {}
        self.ecc = 0
        self.wait: Callable[[], object] | None = None
        self.shutdowns = 0

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml"):
            return self._call(name)
        raise AttributeError(name)

    def _call(self, name: str) -> Callable[..., object]:
        def call(*args: object) -> object:
            index = _index(args[0]) if args and isinstance(args[0], ctypes.c_void_p) else None
            if name in self.fail and (self.on is None or self.on == index):
                raise pynvml.NVMLError(self.fail[name])
            if name in self.answers:
                return self.answers[name]
            return self._answer(name, index, args)

        return call

    def _answer(self, name: str, index: int | None, args: tuple[object, ...]) -> object:
        if name == "nvmlDeviceGetNvLinkState":
            return 1 if int(args[1]) < 4 else 0  # type: ignore[call-overload]
        simple: dict[str, object] = {
            "nvmlInit": None,
            "nvmlSystemGetDriverVersion": "570.1",
            "nvmlDeviceGetCount": 2,
            "nvmlDeviceGetUUID": f"GPU-{index}",
            "nvmlDeviceGetPciInfo": SimpleNamespace(busId=f"00000000:{index or 0:02X}:00.0"),
            "nvmlDeviceGetName": b"NVIDIA Test",
            "nvmlDeviceGetMemoryInfo": SimpleNamespace(total=80 * 2**30),
            "nvmlDeviceGetMinorNumber": index,
            "nvmlDeviceGetMigMode": (0, 0),
            "nvmlDeviceGetBrand": pynvml.NVML_BRAND_NVIDIA,
            "nvmlDeviceGetArchitecture": pynvml.NVML_DEVICE_ARCH_HOPPER,
            "nvmlDeviceGetCudaComputeCapability": (9, 0),
            "nvmlDeviceGetNvLinkRemoteDeviceType": 2,
            "nvmlDeviceGetNvLinkRemotePciInfo": SimpleNamespace(busId=NVSWITCH_BUS_ID),
            "nvmlDeviceGetTotalEccErrors": self.ecc,
            "nvmlEventSetCreate": object(),
            "nvmlDeviceGetSupportedEventTypes": pynvml.nvmlEventTypeXidCriticalError,
            "nvmlDeviceRegisterEvents": None,
            "nvmlEventSetFree": None,
        }
        if name == "nvmlDeviceGetHandleByIndex":
            return ctypes.c_void_p(0x1000 + int(args[0]))  # type: ignore[call-overload]
        if name == "nvmlDeviceGetHandleByUUID":
            uuid = str(args[0])
            if uuid not in ("GPU-0", "GPU-1"):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
            return ctypes.c_void_p(0x1000 + int(uuid[-1]))
        if name == "nvmlEventSetWait_v2":
            if self.wait is not None:
                return self.wait()
            # NVML's own wait, timing out (at most 50 ms here): what the fake stands for
            time.sleep(min(int(args[1]), 50) / 1000)  # type: ignore[call-overload]
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        if name == "nvmlShutdown":
            self.shutdowns += 1
            return None
        return simple[name]


def _index(handle: ctypes.c_void_p) -> int:
    return int(handle.value or 0) - 0x1000


@pytest.fixture
def lib() -> FakeLib:
    return FakeLib()


def _backend(lib: FakeLib) -> NvmlBackend:
    backend = NvmlBackend(lib=lib)
    backend.init()
    return backend


def test_nvswitch_sentinel_links_count_as_switch_links_not_peers(lib: FakeLib) -> None:
    gpus = _backend(lib).gpus()
    assert [(g.uuid, g.nvlink_peers, g.nvswitch_links) for g in gpus] == [
        ("GPU-0", (), 4),
        ("GPU-1", (), 4),
    ]


def test_sentinel_bus_id_without_a_device_type_is_still_a_switch_link(lib: FakeLib) -> None:
    lib.fail["nvmlDeviceGetNvLinkRemoteDeviceType"] = pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    assert [g.nvswitch_links for g in _backend(lib).gpus()] == [4, 4]


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("failure", FAILURES.values(), ids=FAILURES.keys())
def test_a_field_nvml_will_not_give_keeps_the_gpu_listed(
    lib: FakeLib, field: str, failure: int
) -> None:
    lib.fail[field] = failure
    lib.on = 1
    gpus = _backend(lib).gpus()
    assert [g.uuid for g in gpus] == ["GPU-0", "GPU-1"]
    assert gpus[0].pci_bus_id == "00000000:00:00.0"
    assert gpus[0].nvswitch_links == 4


@pytest.mark.parametrize("failure", FAILURES.values(), ids=FAILURES.keys())
def test_only_a_gpu_without_a_uuid_is_left_out(lib: FakeLib, failure: int) -> None:
    lib.fail["nvmlDeviceGetUUID"] = failure
    lib.on = 0
    assert [g.uuid for g in _backend(lib).gpus()] == ["GPU-1"]


def test_odd_names_and_bus_ids_are_kept_as_text(lib: FakeLib) -> None:
    lib.answers["nvmlDeviceGetName"] = b"NVIDIA \xff\xfe GPU"
    lib.answers["nvmlDeviceGetPciInfo"] = SimpleNamespace(busId=b"not-a-bus-id")
    gpu = _backend(lib).gpus()[0]
    assert (gpu.name, gpu.pci_bus_id) == ("NVIDIA \ufffd\ufffd GPU", "NOT-A-BUS-ID")


@pytest.mark.parametrize(
    ("failure", "lost", "error"),
    [
        pytest.param(pynvml.NVML_ERROR_GPU_IS_LOST, True, False, id="gpu-is-lost"),
        pytest.param(pynvml.NVML_ERROR_UNKNOWN, False, True, id="unknown"),
        pytest.param(pynvml.NVML_ERROR_NO_PERMISSION, False, True, id="no-permission"),
        pytest.param(NEW_CODE, False, True, id="new-code"),
        pytest.param(pynvml.NVML_ERROR_NOT_SUPPORTED, False, False, id="not-supported"),
    ],
)
def test_status_says_what_failed_and_never_raises_for_a_listed_gpu(
    lib: FakeLib, failure: int, lost: bool, error: bool
) -> None:
    backend = _backend(lib)
    backend.gpus()
    lib.fail["nvmlDeviceGetMemoryInfo"] = failure
    status = backend.status("GPU-1")
    assert (status.lost, status.error is not None) == (lost, error)


def test_a_listed_gpu_nvml_no_longer_finds_is_lost(lib: FakeLib) -> None:
    backend = _backend(lib)
    backend.gpus()
    lib.fail["nvmlDeviceGetMemoryInfo"] = pynvml.NVML_ERROR_NOT_FOUND
    assert backend.status("GPU-1").lost


def test_a_listed_gpu_is_asked_through_its_own_handle_not_a_uuid_search(lib: FakeLib) -> None:
    """NVML answers a lookup by UUID with GPU_IS_LOST when any GPU fell off the bus."""
    backend = _backend(lib)
    backend.gpus()
    lib.fail["nvmlDeviceGetHandleByUUID"] = pynvml.NVML_ERROR_GPU_IS_LOST
    assert backend.status("GPU-1").answering


def test_a_growing_uncorrectable_ecc_count_reads_as_xid_48(lib: FakeLib) -> None:
    backend = _backend(lib)
    backend.gpus()
    assert backend.status("GPU-0").xids == ()
    lib.ecc = 2
    assert backend.status("GPU-0").xids == (48,)
    assert backend.status("GPU-0").xids == ()


async def test_shutdown_returns_while_an_event_wait_hangs(lib: FakeLib) -> None:
    entered, hang = threading.Event(), threading.Event()

    def wait() -> object:  # nvmlEventSetWait that never returns (until the test ends)
        entered.set()
        return hang.wait()

    lib.wait = wait
    backend = _backend(lib)
    waiting = asyncio.ensure_future(backend.next_events(30))
    await async_wait_until(entered.is_set, what="the wait is in the driver")
    began = time.monotonic()
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    await asyncio.to_thread(backend.shutdown)
    took = time.monotonic() - began
    hang.set()
    assert took < 2.0
    assert lib.shutdowns == 0  # not under a call that still hangs in the driver


def _event_threads() -> set[int | None]:
    return {t.ident for t in threading.enumerate() if t.name == "nvml-events"}


async def test_event_waits_share_one_thread_that_outlives_a_failed_wait(lib: FakeLib) -> None:
    before = _event_threads()
    backend = _backend(lib)
    for _ in range(5):
        assert await backend.next_events(0.02) == []
    lib.fail["nvmlEventSetWait_v2"] = pynvml.NVML_ERROR_UNKNOWN
    with pytest.raises(BackendError, match="waiting for events"):
        await backend.next_events(5)  # woken by the failure, not by its deadline
    del lib.fail["nvmlEventSetWait_v2"]
    events = [_xid_data(1, 79)]
    lib.wait = lambda: events.pop() if events else _timeout()
    began = time.monotonic()
    while not (seen := await backend.next_events(0.1)):
        assert time.monotonic() - began < 5
    assert seen == [XidEvent("GPU-1", 79)]
    threads = _event_threads() - before
    assert len(threads) == 1
    lib.wait = None
    backend.shutdown()
    assert lib.shutdowns == 1
    await async_wait_until(lambda: not threads & _event_threads(), what="the thread ends")


def _timeout() -> object:
    time.sleep(0.01)  # a short wait of NVML's own that ends without events
    raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)


def _xid_data(index: int, xid: int) -> SimpleNamespace:
    return SimpleNamespace(
        eventType=pynvml.nvmlEventTypeXidCriticalError,
        eventData=xid,
        device=ctypes.c_void_p(0x1000 + index),
    )
