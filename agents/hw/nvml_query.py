"""Reading one GPU's facts from pynvml without letting any one answer fail the GPU:
each field NVML will not give keeps a default and is logged once."""

from __future__ import annotations

import contextlib
import ctypes
import uuid as uuidlib
from collections.abc import Iterator
from typing import Any

import pynvml
import structlog

from agents.core.gfd_facts import Fabric
from agents.core.mig import mig_profile_name
from agents.errors import BackendError
from agents.hw.nvml import (
    ARCHITECTURES,
    BRANDS,
    GpuInfo,
    MigEngines,
    MigInstance,
    NvLink,
    nvlink_ends,
)

log = structlog.get_logger(__name__)

# What an odd answer raises in pynvml or ctypes besides NVMLError: a bad decode,
# a missing symbol in an old driver, a structure of an unexpected shape.
ODD_ANSWERS = (pynvml.NVMLError, ValueError, TypeError, UnicodeError, AttributeError)
_NO_SUCH_LINK = (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT)


@contextlib.contextmanager
def translated(what: str) -> Iterator[None]:
    """NVML's odd answers to what is being done, as one BackendError that says what."""
    try:
        yield
    except ODD_ANSWERS as exc:
        raise BackendError(f"NVML {what}: {exc}") from exc


def code(exc: BaseException) -> int:
    return int(getattr(exc, "value", pynvml.NVML_ERROR_UNKNOWN))


def text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def handle_key(handle: Any) -> int:
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class GpuReader:
    """Reads GpuInfo through `lib` (pynvml, or a stand-in with its interface)."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self._warned: set[tuple[int, str]] = set()
        self.handles: dict[str, Any] = {}  # UUID -> the handle NVML gave for its index

    def info(self, index: int) -> GpuInfo | None:
        """The GPU at `index`, or None (with a warning) when NVML gives no UUID for it."""
        lib = self._lib
        try:
            handle = lib.nvmlDeviceGetHandleByIndex(index)
            uuid = text(lib.nvmlDeviceGetUUID(handle))
        except ODD_ANSWERS as exc:
            log.warning("gpu_without_uuid", index=index, error=str(exc), effect="left out")
            return None
        if not uuid:
            log.warning("gpu_without_uuid", index=index, error="empty", effect="left out")
            return None
        self.handles[uuid] = handle
        memory = self._read(
            index, "memory", 0, lambda: int(lib.nvmlDeviceGetMemoryInfo(handle).total)
        )
        mode = self._read(index, "mig_mode", None, lambda: self._mig_mode(handle))
        mig = mode == pynvml.NVML_DEVICE_MIG_ENABLE
        instances: tuple[MigInstance, ...] = ()
        if mig:
            instances = self._read(index, "mig_instances", (), lambda: self._migs(handle, memory))
        peers, switch_links = nvlink_ends(self._links(index, handle))
        return GpuInfo(
            index=index,
            uuid=uuid,
            pci_bus_id=self._read(
                index, "pci_bus_id", "", lambda: text(lib.nvmlDeviceGetPciInfo(handle).busId)
            ).upper(),
            name=self._read(index, "name", "", lambda: text(lib.nvmlDeviceGetName(handle))),
            memory_mib=memory // 2**20,
            minor=self._read(
                index, "minor", index, lambda: int(lib.nvmlDeviceGetMinorNumber(handle))
            ),
            mig_enabled=mig,
            mig_capable=mode is not None,
            mig_instances=instances,
            nvlink_peers=peers,
            nvswitch_links=switch_links,
            brand=self._read(
                index, "brand", "", lambda: _named(BRANDS, lib.nvmlDeviceGetBrand(handle))
            ),
            architecture=self._read(
                index,
                "architecture",
                "",
                lambda: ARCHITECTURES.get(int(lib.nvmlDeviceGetArchitecture(handle)), "Unknown"),
            ),
            compute_capability=self._read(
                index,
                "compute_capability",
                "",
                lambda: "{}.{}".format(*lib.nvmlDeviceGetCudaComputeCapability(handle)),
            ),
        )

    def _read(self, index: int, what: str, default: Any, call: Any) -> Any:
        try:
            return call()
        except ODD_ANSWERS as exc:
            not_supported = code(exc) == pynvml.NVML_ERROR_NOT_SUPPORTED
            if not not_supported and (index, what) not in self._warned:
                self._warned.add((index, what))
                log.warning("nvml_field_unreadable", index=index, field=what, error=str(exc))
            return default

    def _mig_mode(self, handle: object) -> int:
        """The current MIG mode; NotSupported (no MIG) leaves it None, as go-nvlib's
        IsMigCapable says false then."""
        return int(self._lib.nvmlDeviceGetMigMode(handle)[0])

    def _migs(self, handle: object, memory_bytes: int) -> tuple[MigInstance, ...]:
        lib = self._lib
        out: list[MigInstance] = []
        for slot in range(int(lib.nvmlDeviceGetMaxMigDeviceCount(handle))):
            try:
                mig = lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            except pynvml.NVMLError as exc:
                if code(exc) == pynvml.NVML_ERROR_NOT_FOUND:
                    continue  # an empty slot
                raise
            attrs = lib.nvmlDeviceGetAttributes(mig)
            profile = mig_profile_name(
                int(attrs.gpuInstanceSliceCount),
                int(attrs.computeInstanceSliceCount),
                int(attrs.memorySizeMB),
                memory_bytes,
            )
            gi = int(lib.nvmlDeviceGetGpuInstanceId(mig))
            info = lib.nvmlGpuInstanceGetInfo(lib.nvmlDeviceGetGpuInstanceById(handle, gi))
            out.append(
                MigInstance(
                    uuid=text(lib.nvmlDeviceGetUUID(mig)),
                    profile=profile,
                    gpu_instance=gi,
                    compute_instance=int(lib.nvmlDeviceGetComputeInstanceId(mig)),
                    gi_profile_id=int(info.profileId),
                    placement_start=int(info.placement.start),
                    placement_size=int(info.placement.size),
                    engines=MigEngines(
                        multiprocessors=int(attrs.multiprocessorCount),
                        copy_engines=int(attrs.sharedCopyEngineCount),
                        decoders=int(attrs.sharedDecoderCount),
                        encoders=int(attrs.sharedEncoderCount),
                        jpeg_engines=int(attrs.sharedJpegCount),
                        ofa_engines=int(attrs.sharedOfaCount),
                        memory_mib=int(attrs.memorySizeMB),
                        gi_slices=int(attrs.gpuInstanceSliceCount),
                        ci_slices=int(attrs.computeInstanceSliceCount),
                    ),
                )
            )
        return tuple(out)

    def _links(self, index: int, handle: object) -> list[NvLink]:
        """NVML's answer for each active NVLink; a link it will not describe is skipped."""
        lib = self._lib
        links: list[NvLink] = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                if lib.nvmlDeviceGetNvLinkState(handle, link) != pynvml.NVML_FEATURE_ENABLED:
                    continue
            except ODD_ANSWERS as exc:
                if code(exc) in _NO_SUCH_LINK:
                    continue  # no NVLink at all, or fewer links than the maximum
                self._read(index, f"nvlink{link}", None, _raiser(exc))
                continue
            links.append(self._link(index, handle, link))
        return links

    def _link(self, index: int, handle: object, link: int) -> NvLink:
        lib = self._lib
        remote_type = self._read(
            index,
            "nvlink_remote_type",
            None,
            lambda: int(lib.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)),
        )
        bus = self._read(
            index,
            "nvlink_remote_pci",
            "",
            lambda: text(lib.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId),
        )
        return NvLink(remote_type, bus)


def fabric_info(lib: Any, handle: object) -> Fabric | None:
    """The GPU's fabric through nvmlDeviceGetGpuFabricInfoV, or, on drivers before it,
    nvmlDeviceGetGpuFabricInfo (the same fields, no health mask); None where NVML answers
    NotSupported."""
    try:
        info: Any = pynvml.c_nvmlGpuFabricInfo_v2_t()
        try:
            lib.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
        except pynvml.NVMLError as exc:
            if code(exc) != pynvml.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
            info = pynvml.c_nvmlGpuFabricInfo_t()
            lib.nvmlDeviceGetGpuFabricInfo(handle, ctypes.byref(info))
    except pynvml.NVMLError as exc:
        if code(exc) == pynvml.NVML_ERROR_NOT_SUPPORTED:
            return None
        raise
    return Fabric(
        cluster_uuid=str(uuidlib.UUID(bytes=bytes(info.clusterUuid))),
        clique_id=int(info.cliqueId),
        state=int(info.state),
        status=int(info.status),
        health_mask=int(getattr(info, "healthMask", 0)),
    )


def _named(names: tuple[str, ...], value: object) -> str:
    number = int(value)  # type: ignore[call-overload]
    return names[number] if 0 <= number < len(names) else "Unknown"


def _raiser(exc: BaseException) -> Any:
    def call() -> None:
        raise exc

    return call
