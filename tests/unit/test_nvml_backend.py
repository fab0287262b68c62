"""The real NVML backend where no GPU is present, and its MIG-name helper. Its answers on
real libnvidia-ml are pinned by tests/contract and tests/integration/test_mock_nvml.py."""

from __future__ import annotations

import pynvml
import pytest

from agents.core.mig import mig_profile_name
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
