"""Node labels as a feature file in a node-feature-discovery local source directory.

No API access is needed: the feature-discovery worker on the node reads the file.
The file is rewritten atomically on start and whenever device health changes.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import structlog

from agents.atomic_file import write_atomically
from agents.kernel.catalogue import Inventory
from agents.tasks import first

log = structlog.get_logger(__name__)

PREFIX = "node-agents.io/"
_VALUE = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(text: str) -> str:
    """A valid label value: at most 63 of [A-Za-z0-9._-], starting and ending alphanumeric."""
    return _VALUE.sub("-", text).strip("-._")[:63].rstrip("-._")


def prefixed(labels: Mapping[str, str]) -> dict[str, str]:
    """Label names of the families as the node carries them, sorted: a bare name gets our
    prefix; one with a prefix of its own (the fabric's keys) stays as it is."""
    full = {(key if "/" in key else PREFIX + key): value for key, value in labels.items()}
    return dict(sorted(full.items()))


def write_feature_file(path: Path, labels: Mapping[str, str]) -> None:
    """Replace the file atomically, so the reader never sees half of it."""
    text = "".join(f"{key}={value}\n" for key, value in labels.items())
    write_atomically(path, text.encode(), 0o644)
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
    path: Path, labels: Callable[[], Mapping[str, str]], inventories: Sequence[Inventory]
) -> None:
    """Write the feature file now and again whenever a device list changes, until cancelled.

    Labels are optional: a file that cannot be written is logged (once until a write
    succeeds) and tried again on the next change; the device plugins keep serving.
    """
    written: dict[str, str] | None = None
    while True:
        versions = [i.version for i in inventories]
        wanted = prefixed(labels())
        if wanted != written:
            failed = written is _FAILED
            written = await asyncio.to_thread(_try_write, path, wanted, failed=failed)
        await first(*(i.wait_newer(v) for i, v in zip(inventories, versions, strict=True)))
