"""One GPU's degraded-device signals read through pynvml (docs/degraded.md): each query
NVML does not offer, or answers oddly, leaves its field None; a lost GPU is an error."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pynvml

from agents.core.gfd_facts import Fabric
from agents.core.gpu_signals import GpuReading
from agents.errors import BackendError
from agents.hw.nvml_query import ODD_ANSWERS, code, fabric_info

T = TypeVar("T")
RECOVERY_ACTION_FIELD = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (drivers from R570)
_LOST = (pynvml.NVML_ERROR_GPU_IS_LOST,)
_NO_SUCH_LINK = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)
_VALUE_MEMBERS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}


class SignalReader:
    """Reads GpuReading through `lib` (pynvml, or a stand-in with its interface)."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        # Each GPU's link indices that answered "no such link" in a full read: not asked
        # again until forget() (a reset). Of NVML_NVLINK_MAX_LINKS (36) an H100 has 18
        # and an L40S none: each round cost 18 or 36 refused calls a GPU, each raised and
        # caught in Python.
        self._absent_links: dict[str, frozenset[int]] = {}
        # GPUs whose fabric info answered NotSupported (no fabric): not asked again.
        self._no_fabric: set[str] = set()

    def forget(self, uuid: str) -> None:
        """The GPU was reset: ask it about every link, and its fabric, again."""
        self._absent_links.pop(uuid, None)
        self._no_fabric.discard(uuid)

    def reading(self, handle: object, uuid: str) -> GpuReading:
        """Blocking: every signal's query of the GPU `uuid` behind `handle`. BackendError
        when NVML says the GPU is lost (the probe means nothing then)."""
        lib = self._lib
        remapped = self._ask(lambda: tuple(lib.nvmlDeviceGetRemappedRows(handle)))
        return GpuReading(
            pcie_width=self._ask(lambda: int(lib.nvmlDeviceGetCurrPcieLinkWidth(handle))),
            pcie_max_width=self._ask(lambda: int(lib.nvmlDeviceGetMaxPcieLinkWidth(handle))),
            pcie_gen=self._ask(lambda: int(lib.nvmlDeviceGetCurrPcieLinkGeneration(handle))),
            pcie_max_gen=self._first(
                lambda: int(lib.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
                lambda: int(lib.nvmlDeviceGetGpuMaxPcieLinkGeneration(handle)),
            ),
            utilization=self._ask(lambda: int(lib.nvmlDeviceGetUtilizationRates(handle).gpu)),
            pcie_replays=self._ask(lambda: int(lib.nvmlDeviceGetPcieReplayCounter(handle))),
            nvlinks=self._nvlinks(handle, uuid),
            clock_events=self._first(
                lambda: int(lib.nvmlDeviceGetCurrentClocksEventReasons(handle)),
                lambda: int(lib.nvmlDeviceGetCurrentClocksThrottleReasons(handle)),
            ),
            remap_pending=None if remapped is None else bool(remapped[2]),
            remap_failed=None if remapped is None else bool(remapped[3]),
            retired_pages_pending=self._ask(
                lambda: (
                    lib.nvmlDeviceGetRetiredPagesPendingStatus(handle)
                    == pynvml.NVML_FEATURE_ENABLED
                )
            ),
            recovery_action=self._ask(lambda: self._recovery_action(handle)),
            **self._telemetry(handle),
            fabric=self._fabric(handle, uuid),
        )

    def _ask(self, call: Callable[[], T]) -> T | None:
        try:
            return call()
        except ODD_ANSWERS as exc:
            if code(exc) in _LOST:
                raise BackendError(f"NVML probe: {exc}") from exc
            return None

    def _first(self, *calls: Callable[[], T]) -> T | None:
        """The first call that answers: a newer NVML function, then its older name."""
        for call in calls:
            value = self._ask(call)
            if value is not None:
                return value
        return None

    def _nvlinks(self, handle: object, uuid: str) -> tuple[bool, ...] | None:
        """Each link's state by index, up to the last link NVML describes (it answers
        INVALID_ARGUMENT for an index past the GPU's links: an H100 has 18 of NVML's 36,
        asked once a GPU, until its reset); None without NVLink, or when a link answers
        oddly (a link that cannot be read must not look down)."""
        lib = self._lib
        known = self._absent_links.get(uuid)
        absent: set[int] = set()
        states: list[bool] = []
        answered = 0  # links up to the last NVML gave a state for: the GPU has NVLink
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            if known is not None and link in known:
                states.append(False)  # no such link
                continue
            try:
                state = lib.nvmlDeviceGetNvLinkState(handle, link)
            except ODD_ANSWERS as exc:
                if code(exc) in _LOST:
                    raise BackendError(f"NVML probe: {exc}") from exc
                if code(exc) not in _NO_SUCH_LINK:
                    return None
                absent.add(link)
                states.append(False)  # no such link
                continue
            states.append(state == pynvml.NVML_FEATURE_ENABLED)
            answered = len(states)
        if known is None:
            self._absent_links[uuid] = frozenset(absent)
        return tuple(states[:answered]) if answered else None

    def _fabric(self, handle: object, uuid: str) -> Fabric | None:
        """The GPU's fabric and its health; None without fabric (then not asked again
        until forget()) or on an odd answer."""
        if uuid in self._no_fabric:
            return None
        try:
            fabric = fabric_info(self._lib, handle)
        except ODD_ANSWERS as exc:
            if code(exc) in _LOST:
                raise BackendError(f"NVML probe: {exc}") from exc
            return None
        if fabric is None:
            self._no_fabric.add(uuid)
        return fabric

    def _telemetry(self, handle: object) -> dict[str, Any]:
        """Memory, power, temperature and SM clock: GpuReading's telemetry fields."""
        lib = self._lib
        memory = self._ask(lambda: lib.nvmlDeviceGetMemoryInfo(handle))
        milliwatts = self._ask(lambda: int(lib.nvmlDeviceGetPowerUsage(handle)))
        return {
            "memory_used_bytes": None if memory is None else int(memory.used),
            "memory_total_bytes": None if memory is None else int(memory.total),
            "power_watts": None if milliwatts is None else milliwatts / 1000,
            "temperature_celsius": self._ask(
                lambda: int(lib.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU))
            ),
            "sm_clock_mhz": self._ask(
                lambda: int(lib.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM))
            ),
        }

    def _recovery_action(self, handle: object) -> int | None:
        value = self._lib.nvmlDeviceGetFieldValues(handle, [RECOVERY_ACTION_FIELD])[0]
        if int(value.nvmlReturn) != pynvml.NVML_SUCCESS:
            return None
        member = _VALUE_MEMBERS.get(int(value.valueType))
        return None if member is None else int(getattr(value.value, member))
