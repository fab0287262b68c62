"""The kubelet's device checkpoint as facts: which container holds which devices of which
resource, and which devices each resource had healthy when the file was written."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ContainerKey = tuple[str, str]  # (pod UID, container name)


class CheckpointFormatError(ValueError):
    """The file is not the kubelet's JSON checkpoint format (Kubernetes 1.20 and later)."""


@dataclass(frozen=True)
class Checkpoint:
    holdings: Mapping[str, Mapping[ContainerKey, frozenset[str]]]  # resource -> container -> ids
    registered: Mapping[str, frozenset[str]]  # resource -> healthy device IDs

    def held(self, resource: str) -> frozenset[str]:
        return frozenset().union(*self.holdings.get(resource, {}).values())


def parse_checkpoint(text: str) -> Checkpoint:
    """Raises CheckpointFormatError for anything but the kubelet's format."""
    try:
        document = json.loads(text)
        data = document["Data"]
        entries, registered = data["PodDeviceEntries"], data["RegisteredDevices"]
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointFormatError(f"not a kubelet device checkpoint: {exc}") from exc
    if not isinstance(entries, list | None) or not isinstance(registered, dict | None):
        raise CheckpointFormatError("PodDeviceEntries or RegisteredDevices of the wrong type")
    holdings: dict[str, dict[ContainerKey, frozenset[str]]] = {}
    for entry in entries or ():
        key, resource, ids = _entry(entry)
        held = holdings.setdefault(resource, {})
        held[key] = held.get(key, frozenset()) | ids
    return Checkpoint(
        holdings,
        {name: frozenset(_strings(ids, name)) for name, ids in (registered or {}).items()},
    )


def _entry(entry: Any) -> tuple[ContainerKey, str, frozenset[str]]:
    try:
        key = (str(entry["PodUID"]), str(entry["ContainerName"]))
        resource, by_numa = str(entry["ResourceName"]), entry["DeviceIDs"]
    except (KeyError, TypeError) as exc:
        raise CheckpointFormatError(f"a PodDeviceEntries item lacks {exc}") from exc
    if not isinstance(by_numa, dict):
        raise CheckpointFormatError(f"DeviceIDs of {resource} is not a map of NUMA nodes")
    ids = frozenset(i for numa in by_numa.values() for i in _strings(numa, resource))
    return key, resource, ids


def _strings(value: Any, where: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise CheckpointFormatError(f"device IDs of {where} are not a list of strings")
    return value
