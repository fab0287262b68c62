"""Which resources the GPUs are offered as: whole, MIG instances, time-shared replicas."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from agents.config import Config
from agents.errors import ConfigError
from agents.gpu.discovery import Gpu

GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
REPLICA_SEPARATOR = "::"


@dataclass(frozen=True)
class Unit:
    """One advertised device: a whole GPU, a MIG instance, or a replica of either."""

    id: str
    gpu_uuid: str  # the physical GPU it lives on
    visible_id: str  # what NVIDIA_VISIBLE_DEVICES names: GPU or MIG UUID
    numa: int | None
    replica: int | None = None


@dataclass(frozen=True)
class ResourcePlan:
    name: str
    units: tuple[Unit, ...]
    replicated: bool


def plan_resources(gpus: Sequence[Gpu], config: Config, source: str) -> list[ResourcePlan]:
    """Group the GPUs' units by resource name, as the MIG strategy and sharing say."""
    groups: dict[str, list[Unit]] = {}
    for name, unit in _base_units(gpus, config, source):
        groups.setdefault(name, []).append(unit)
    plans = [_shared(name, units, config, source) for name, units in sorted(groups.items())]
    names = [p.name for p in plans]
    for name in sorted({n for n in names if names.count(n) > 1}):
        # A rename onto a name the node already offers would serve two plugins as one.
        raise ConfigError(
            source,
            "sharing.timeSlicing.resources[].rename",
            f"a name no other GPU resource of this node has; {name} is offered twice",
        )
    return plans


def _base_units(gpus: Sequence[Gpu], config: Config, source: str) -> list[tuple[str, Unit]]:
    strategy = config.flags.mig_strategy
    if strategy == "single":
        _check_single(gpus, source)
    out = []
    for gpu in gpus:
        if strategy != "none" and gpu.mig_enabled:
            for mig in gpu.mig:
                name = GPU_RESOURCE if strategy == "single" else MIG_PREFIX + mig.profile
                out.append((name, Unit(mig.uuid, gpu.uuid, mig.uuid, gpu.numa)))
            continue
        gpu_id = str(gpu.index) if config.flags.device_id_strategy == "index" else gpu.uuid
        out.append((GPU_RESOURCE, Unit(gpu_id, gpu.uuid, gpu.uuid, gpu.numa)))
    return out


def _check_single(gpus: Sequence[Gpu], source: str) -> None:
    profiles = {m.profile for g in gpus for m in g.mig}
    whole = [g.uuid for g in gpus if not g.mig_enabled]
    if whole or len(profiles) != 1:
        found = f"GPUs without MIG: {', '.join(whole)}; " if whole else ""
        raise ConfigError(
            source,
            "flags.migStrategy",
            "single needs every GPU in MIG mode with one profile; "
            f"found {found}profiles {sorted(profiles) or 'none'}",
        )


def _shared(name: str, units: list[Unit], config: Config, source: str) -> ResourcePlan:
    sharing = config.sharing.time_slicing
    entry = sharing.replicas_for(name)
    if entry is None:
        return ResourcePlan(name, tuple(units), replicated=False)
    if entry.devices != "all":
        raise ConfigError(
            source, "sharing.timeSlicing.resources[].devices", "only 'all' is supported"
        )
    renamed = sharing.advertised_name(name)
    replicas = tuple(
        Unit(f"{u.id}{REPLICA_SEPARATOR}{n}", u.gpu_uuid, u.visible_id, u.numa, n)
        for u in units
        for n in range(entry.replicas)
    )
    return ResourcePlan(renamed, replicas, replicated=True)
