"""What a container gets for a set of a family's devices (environment, device nodes,
mounts, the names a runtime hook and CDI know them by), made once per allocation and free
of any API's wire form: the device-plugin runtime turns it into its Allocate answer, the
DRA runtime into CDI specs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from agents.core.device import DeviceNode, Mount

DeviceKey = tuple[str, str]  # (resource, device ID)
# Per device shared by a claim (DRA's consumable capacity): each capacity's name and the
# quantity the claim's shares of it consume ("memory": "20Gi").
Consumed = Mapping[DeviceKey, Mapping[str, str]]
T = TypeVar("T")


@dataclass(frozen=True)
class Companions:
    """Devices a container gets with every allocation of a family's devices, chosen by
    no one (NVIDIA's IMEX channels): a hook reads their names from a variable of their
    own, or from the names of files mounted in `mount_subdir` of the devices' directory."""

    variable: str
    names: tuple[str, ...]
    mount_subdir: str

    def joined(self) -> str:
        return ",".join(self.names)


@dataclass(frozen=True)
class DeviceNames:
    """How a vendor's container runtime hook and its CDI specs know the devices: the
    names a hook reads from `variable` (or from the names of files mounted in
    `mount_dir`), and the qualified CDI device names (`vendor/class=name`) of the same
    devices, of their companions and of the features they come with. `annotation` is
    what a CDI annotation's key calls the one who wrote it."""

    variable: str
    names: tuple[str, ...]
    cdi: tuple[str, ...]
    mount_dir: str
    annotation: str
    companions: tuple[Companions, ...] = ()

    def joined(self) -> str:
        """The names as the hook reads them from `variable`."""
        return ",".join(self.names)


@dataclass(frozen=True)
class ContainerEdits:
    """What one container gets for its devices together.

    `env` and `mounts` hold in every case; `nodes` are every device node the container
    opens, in order, and `device_nodes` the ones each device (resource, device ID) needs
    on its own; `names`, where a runtime hook or CDI injects the devices, says how they
    know them (None: the container gets just these edits)."""

    env: Mapping[str, str] = field(default_factory=dict)
    nodes: tuple[DeviceNode, ...] = ()
    device_nodes: Mapping[DeviceKey, tuple[DeviceNode, ...]] = field(default_factory=dict)
    mounts: tuple[Mount, ...] = ()
    names: DeviceNames | None = None

    def named_env(self) -> dict[str, str]:
        """The environment with the devices named in it, where they have names."""
        env = dict(self.env)
        if self.names is not None:
            env[self.names.variable] = self.names.joined()
            env.update((c.variable, c.joined()) for c in self.names.companions)
        return env


class KeptEdits:
    """A resource's container edits per set of device IDs in the order given, each made
    once: they depend on nothing else until `clear`. Past `limit` sets, all are forgotten
    (a bound on memory, not a policy)."""

    def __init__(self, make: Callable[[Sequence[str]], ContainerEdits], limit: int) -> None:
        self._make, self._limit = make, limit
        self._kept: dict[tuple[str, ...], ContainerEdits] = {}

    def get(self, device_ids: Sequence[str]) -> ContainerEdits:
        key = tuple(device_ids)
        edits = self._kept.get(key)
        if edits is None:
            if len(self._kept) >= self._limit:
                self._kept.clear()
            edits = self._kept[key] = self._make(device_ids)
        return edits

    def clear(self) -> None:
        self._kept.clear()


def by_resource(devices: Iterable[DeviceKey]) -> dict[str, list[str]]:
    """Device IDs by resource, resources in the order they first appear."""
    out: dict[str, list[str]] = {}
    for resource, device_id in devices:
        out.setdefault(resource, []).append(device_id)
    return out


def merged(parts: Sequence[ContainerEdits]) -> ContainerEdits:
    """Several resources' edits as one container's."""
    if len(parts) == 1:
        return parts[0]
    env: dict[str, str] = {}
    device_nodes: dict[DeviceKey, tuple[DeviceNode, ...]] = {}
    for part in parts:
        env = merge_env(env, part.env)
        device_nodes.update(part.device_nodes)
    return ContainerEdits(
        env,
        _unique(n for part in parts for n in part.nodes),
        device_nodes,
        _unique(m for part in parts for m in part.mounts),
        _merged_names([p.names for p in parts if p.names is not None]),
    )


def _merged_names(names: Sequence[DeviceNames]) -> DeviceNames | None:
    if not names:
        return None
    first = names[0]
    companions: dict[tuple[str, str], tuple[str, ...]] = {}
    for part in names:
        for c in part.companions:
            key = (c.variable, c.mount_subdir)
            companions[key] = _unique((*companions.get(key, ()), *c.names))
    return DeviceNames(
        first.variable,
        _unique(n for part in names for n in part.names),
        _unique(c for part in names for c in part.cdi),
        first.mount_dir,
        first.annotation,
        tuple(Companions(v, n, d) for (v, d), n in companions.items()),
    )


def _unique(items: Iterable[T]) -> tuple[T, ...]:
    return tuple(dict.fromkeys(items))


def merge_env(a: Mapping[str, str], b: Mapping[str, str]) -> dict[str, str]:
    """Two allocations' environments as one: a variable both set lists both values."""
    out = dict(a)
    for key, value in b.items():
        out[key] = f"{out[key]},{value}" if key in out and out[key] != value else value
    return out
