"""NVML answered from a node file: the simulated twin of the real NVML backend.

It speaks as NVML does (PCI bus IDs in NVML's form, XID 79 for a GPU that fell off the bus).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Sequence

from agents.core.pci import nvml_bus_id
from agents.errors import BackendError
from agents.hw.nvml import GpuInfo, GpuStatus, XidEvent
from agents.sim.node import GpuSpec, NodeSpec

XID_FALLEN_OFF_BUS = 79
DRIVER_VERSION = "550.54.15"


class SimNvml:
    """Implements agents.hw.nvml.Nvml for a simulated node; `update(node)` on reloads."""

    def __init__(self, node: NodeSpec) -> None:
        self._node = node
        self._pending: list[XidEvent] = []
        self._changed = asyncio.Event()
        self._refs = 0

    def init(self) -> None:
        self._refs += 1

    def shutdown(self) -> None:
        self._refs = max(self._refs - 1, 0)

    def driver_version(self) -> str:
        self._require_init()
        return DRIVER_VERSION

    def gpus(self) -> Sequence[GpuInfo]:
        self._require_init()
        by_uuid = {g.uuid: g for g in self._node.gpus}
        return [_info(i, g, by_uuid) for i, g in enumerate(self._node.gpus)]

    def status(self, uuid: str) -> GpuStatus:
        self._require_init()
        gpu = self._node.gpu(uuid)
        if gpu is None:
            # As real NVML answers for a GPU taken off the node: not found.
            raise BackendError(f"NVML: no GPU with UUID {uuid}")
        return GpuStatus(lost=gpu.lost, pending_xids=frozenset(gpu.xids))

    async def next_events(self, timeout_s: float) -> list[XidEvent]:
        """XIDs appended since the last call; returns early whenever the node changed."""
        self._require_init()
        if not self._pending:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(timeout_s, 0.0)):  # a timer, not a task
                    await self._changed.wait()
        self._changed.clear()
        events, self._pending = self._pending, []
        return events

    def update(self, node: NodeSpec) -> None:
        """Take a reloaded node file: queue its new XIDs and wake next_events()."""
        if node == self._node:
            return
        old = {g.uuid: g for g in self._node.gpus}
        for gpu in node.gpus:
            self._pending.extend(_new_events(old.get(gpu.uuid), gpu))
        self._node = node
        self._changed.set()

    def _require_init(self) -> None:
        if self._refs <= 0:
            raise BackendError("NVML: not initialized")


def _new_events(old: GpuSpec | None, new: GpuSpec) -> list[XidEvent]:
    before = old.xids if old is not None else ()
    if new.xids[: len(before)] == before:
        added = list(new.xids[len(before) :])
    else:
        added = list((Counter(new.xids) - Counter(before)).elements())
    if new.lost and (old is None or not old.lost):
        added.append(XID_FALLEN_OFF_BUS)
    return [XidEvent(new.uuid, xid) for xid in added]


def _info(index: int, gpu: GpuSpec, by_uuid: dict[str, GpuSpec]) -> GpuInfo:
    return GpuInfo(
        index=index,
        uuid=gpu.uuid,
        pci_bus_id=nvml_bus_id(gpu.pci),
        name=gpu.model,
        memory_mib=gpu.memory_mib,
        minor=gpu.minor,
        mig_enabled=gpu.mig_enabled,
        mig_instances=gpu.mig_instances if gpu.mig_enabled else (),
        nvlink_peers=tuple(nvml_bus_id(by_uuid[p].pci) for p in gpu.nvlinks if p in by_uuid),
    )
