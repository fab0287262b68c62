"""What a container gets for a set of a family's devices (environment, device nodes,
mounts), free of any API's wire form: the device-plugin runtime answers Allocate with
its own, the DRA runtime writes CDI specs from this."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from agents.core.device import DeviceSpec, Mount

DeviceKey = tuple[str, str]  # (resource, device ID)


@dataclass(frozen=True)
class ContainerEdits:
    """The environment and mounts a container gets for its devices together, and the
    device nodes each device is opened through, by (resource, device ID)."""

    env: Mapping[str, str] = field(default_factory=dict)
    nodes: Mapping[DeviceKey, tuple[DeviceSpec, ...]] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()


def by_resource(devices: Iterable[DeviceKey]) -> dict[str, list[str]]:
    """Device IDs by resource, resources in the order they first appear."""
    out: dict[str, list[str]] = {}
    for resource, device_id in devices:
        out.setdefault(resource, []).append(device_id)
    return out


def merged(parts: Sequence[ContainerEdits]) -> ContainerEdits:
    """Several resources' edits as one container's."""
    env: dict[str, str] = {}
    nodes: dict[DeviceKey, tuple[DeviceSpec, ...]] = {}
    mounts: list[Mount] = []
    for part in parts:
        env = merge_env(env, part.env)
        nodes.update(part.nodes)
        mounts.extend(m for m in part.mounts if m not in mounts)
    return ContainerEdits(env, nodes, tuple(mounts))


def merge_env(a: Mapping[str, str], b: Mapping[str, str]) -> dict[str, str]:
    """Two allocations' environments as one: a variable both set lists both values."""
    out = dict(a)
    for key, value in b.items():
        out[key] = f"{out[key]},{value}" if key in out and out[key] != value else value
    return out
