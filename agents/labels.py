"""Node labels as a feature file in a node-feature-discovery local source directory.

No API access is needed: the feature-discovery worker on the node reads the file.
The file is rewritten atomically on start and whenever device health changes.
"""

from __future__ import annotations

import asyncio
import os
import re
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from agents.core.topology import Distance, Topology
from agents.gpu.discovery import Gpu
from agents.plugin.resource import Resource
from agents.roce.discovery import Nic

if TYPE_CHECKING:
    from agents.gpu.family import GpuFamily
    from agents.roce.family import RoceFamily

log = structlog.get_logger(__name__)

PREFIX = "node-agents.io/"
_VALUE = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(text: str) -> str:
    """A valid label value: at most 63 of [A-Za-z0-9._-], starting and ending alphanumeric."""
    return _VALUE.sub("-", text).strip("-._")[:63].rstrip("-._")


def node_labels(
    gpus: Sequence[Gpu],
    nics: Sequence[Nic],
    *,
    healthy_gpus: int,
    healthy_nics: int,
) -> dict[str, str]:
    labels = {
        "gpu.count": str(len(gpus)),
        "gpu.healthy": str(healthy_gpus),
        "roce.count": str(len(nics)),
        "roce.healthy": str(healthy_nics),
        "gpu-nic.pairs": str(_has_close_pairs(gpus, nics)).lower(),
    }
    if gpus:
        labels["gpu.product"] = label_value(gpus[0].model)
        labels["gpu.memory"] = str(gpus[0].memory_mib)
        labels["gpu.mig.capable"] = str(any(g.mig_enabled or g.mig for g in gpus)).lower()
    return {PREFIX + key: value for key, value in sorted(labels.items())}


def family_labels(labels: Mapping[str, str], *, gpu: bool, roce: bool) -> dict[str, str]:
    """Only the labels of the families this agent runs: beside another agent that runs
    the other family (in a file of its own), it must not claim that family's devices."""

    def ours(key: str) -> bool:
        name = key.removeprefix(PREFIX)
        if name.startswith("gpu-nic."):
            return gpu and roce
        return (gpu or not name.startswith("gpu.")) and (roce or not name.startswith("roce."))

    return {key: value for key, value in labels.items() if ours(key)}


def _has_close_pairs(gpus: Sequence[Gpu], nics: Sequence[Nic]) -> bool:
    """Whether some GPU and NIC share a PCIe switch (PIX or PXB)."""
    topology = Topology(
        {g.uuid: g.location for g in gpus if g.location is not None},
        {n.pci: n.location for n in nics if n.location is not None},
    )
    return any(
        topology.pair_distance(gpu, next(iter(near))) <= Distance.PXB
        for gpu, near in topology.pairs().items()
        if near
    )


def write_feature_file(path: Path, labels: Mapping[str, str]) -> None:
    """Replace the file atomically, so the reader never sees half of it."""
    text = "".join(f"{key}={value}\n" for key, value in labels.items())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    log.info("node_labels_written", path=str(path), labels=len(labels))


_FAILED: dict[str, str] = {}  # what `written` is after a failed write: never equal to labels


def _try_write(path: Path, labels: dict[str, str], *, failed: bool) -> dict[str, str]:
    """Write the file; returns what is now written, or _FAILED (logged unless `failed`)."""
    try:
        write_feature_file(path, labels)
    except OSError as exc:
        if not failed:
            log.error(
                "node_labels_unwritable",
                path=str(path),
                error=str(exc),
                effect="device plugins keep serving; labels retried on the next change",
            )
        return _FAILED
    return labels


async def keep_labels(
    path: Path, gpu: GpuFamily | None, roce: RoceFamily | None, stop: asyncio.Event
) -> None:
    """Write the feature file now and again whenever a resource's device list changes.

    Labels are optional: a file that cannot be written is logged (once until a write
    succeeds) and tried again on the next change; the device plugins keep serving.
    """
    resources: list[Resource] = [
        *(gpu.resources() if gpu else ()),
        *(roce.resources() if roce else ()),
    ]
    written: dict[str, str] | None = None
    while not stop.is_set():
        versions = [r.inventory.version for r in resources]
        everything = node_labels(
            gpu.gpus if gpu else [],
            roce.nics if roce else [],
            healthy_gpus=gpu.healthy_count() if gpu else 0,
            healthy_nics=sum(1 for d in roce.resources()[0].inventory.devices if d.healthy)
            if roce
            else 0,
        )
        labels = family_labels(everything, gpu=gpu is not None, roce=roce is not None)
        if labels != written:
            written = _try_write(path, labels, failed=written is _FAILED)
        waits: list[asyncio.Future[object]] = [
            asyncio.ensure_future(r.inventory.wait_newer(v))
            for r, v in zip(resources, versions, strict=True)
        ]
        waits.append(asyncio.ensure_future(stop.wait()))
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waits:
                task.cancel()
