"""The kubelet's device checkpoint: a JSON file replaced by rename, the signal plugins watch."""

from __future__ import annotations

import base64
import json
import os
import tempfile
import uuid
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKPOINT_NAME = "kubelet_internal_checkpoint"
NO_TOPOLOGY = -1


@dataclass(frozen=True)
class CheckpointEntry:
    """Devices of one resource allocated to one container, with the plugin's answer."""

    pod: str
    container: str
    resource: str
    devices_by_numa: Mapping[int, list[str]]
    response: bytes


def pod_uid(pod: str) -> str:
    """A stable UID for a pod name, as the API server would give it one."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"pod/{pod}"))


def checkpoint_data(
    entries: Iterable[CheckpointEntry], registered: Mapping[str, Iterable[str]]
) -> dict[str, Any]:
    """The document in the kubelet's own field names, so a reader written for one reads both."""
    data = {
        "PodDeviceEntries": [
            {
                "PodUID": pod_uid(entry.pod),
                "ContainerName": entry.container,
                "ResourceName": entry.resource,
                "DeviceIDs": {str(numa): ids for numa, ids in entry.devices_by_numa.items()},
                "AllocResp": base64.b64encode(entry.response).decode("ascii"),
            }
            for entry in entries
        ],
        "RegisteredDevices": {name: sorted(ids) for name, ids in registered.items()},
    }
    body = json.dumps(data, sort_keys=True).encode()
    return {"Data": data, "Checksum": zlib.crc32(body)}


def write_checkpoint(path: Path, document: Mapping[str, Any]) -> None:
    """Write a new file beside `path` and rename it over the old one, as the kubelet does."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(document, out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.rename(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
