"""The same checks against every Nvml: the simulated one always, the real one where a GPU
and its driver are present, or an NVML library the tests load (test_real_contract.py runs
this module once per GPU profile and MIG layout, with NVML_CONTRACT_REQUIRED=1: no
skipping there)."""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Iterator

import pytest

from agents.errors import BackendError
from agents.hw.nvml import GpuInfo, Nvml
from agents.sim.bundled import bundled_node
from agents.sim.node import load_node
from agents.sim.nvml import SimNvml

NVML_BUS_ID = re.compile(r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]")
MIG_PROFILE = re.compile(r"(\d+c\.)?\d+g\.\d+gb")


def _nvml_loadable() -> bool:
    """Whether this process can load a libnvidia-ml (a GPU node's driver, or the test
    library that test_real_contract.py puts on LD_LIBRARY_PATH)."""
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


# The real backend runs here only where a library is loadable: elsewhere (CI) the same
# checks run in test_real_contract.py's subprocesses, each over the test library.
BACKENDS = ["simulated"]
if _nvml_loadable() or os.environ.get("NVML_CONTRACT_REQUIRED") == "1":
    BACKENDS.append("real")


def _real() -> Nvml:
    from agents.hw.nvml_backend import NvmlBackend

    backend = NvmlBackend()
    try:
        backend.init()
    except BackendError as exc:
        pytest.fail(f"NVML must initialise here: {exc}")
    return backend


def _sim() -> Nvml:
    nvml = SimNvml(load_node(bundled_node("h100-8gpu-8nic")))
    nvml.init()
    return nvml


@pytest.fixture(params=BACKENDS)
def nvml(request: pytest.FixtureRequest) -> Iterator[Nvml]:
    backend = _sim() if request.param == "simulated" else _real()
    yield backend
    backend.shutdown()


def test_init_and_shutdown_pair_up(nvml: Nvml) -> None:
    nvml.init()  # NVML counts its initialisations
    nvml.shutdown()
    assert nvml.driver_version()


def test_gpus_are_well_formed(nvml: Nvml) -> None:
    gpus = list(nvml.gpus())
    assert gpus
    assert [g.index for g in gpus] == list(range(len(gpus)))
    assert len({g.uuid for g in gpus}) == len(gpus)
    for gpu in gpus:
        _check_gpu(gpu)


def _check_gpu(gpu: GpuInfo) -> None:
    assert gpu.uuid.startswith("GPU-")
    assert NVML_BUS_ID.fullmatch(gpu.pci_bus_id), gpu.pci_bus_id
    assert gpu.name
    assert gpu.memory_mib > 0
    assert gpu.minor >= 0
    # NVLink peers are GPUs; links to NVSwitches (remote bus ID FFFFFFFF:FF:FF.0) are counted
    assert all(NVML_BUS_ID.fullmatch(peer) for peer in gpu.nvlink_peers)
    assert "FFFFFFFF:FF:FF.0" not in gpu.nvlink_peers
    assert gpu.pci_bus_id not in gpu.nvlink_peers
    assert gpu.nvswitch_links >= 0
    if gpu.mig_enabled:
        assert all(m.uuid.startswith("MIG-") for m in gpu.mig_instances)
        assert all(MIG_PROFILE.fullmatch(m.profile) for m in gpu.mig_instances)
        assert len({m.uuid for m in gpu.mig_instances}) == len(gpu.mig_instances)
        assert len({m.gpu_instance for m in gpu.mig_instances}) == len(gpu.mig_instances)
    else:
        assert gpu.mig_instances == ()


def test_every_listed_gpu_answers_normally(nvml: Nvml) -> None:
    for gpu in nvml.gpus():
        assert nvml.status(gpu.uuid).answering


def test_status_of_an_unknown_uuid_is_a_backend_error(nvml: Nvml) -> None:
    with pytest.raises(BackendError):
        nvml.status("no-such-gpu")


async def test_next_events_returns_a_list_by_its_deadline(nvml: Nvml) -> None:
    assert isinstance(await nvml.next_events(timeout_s=0.05), list)


def test_queries_after_shutdown_are_backend_errors(nvml: Nvml) -> None:
    nvml.shutdown()
    try:
        with pytest.raises(BackendError):
            nvml.gpus()
    finally:
        nvml.init()
