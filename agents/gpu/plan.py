"""Which resources the GPUs are offered as: whole, MIG instances, time-shared replicas."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import structlog

from agents.config import MAX_SHARED_DEVICES, Config
from agents.errors import ConfigError
from agents.gpu.discovery import Gpu

log = structlog.get_logger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
MIG_PREFIX = "nvidia.com/mig-"
REPLICA_SEPARATOR = "::"


@dataclass(frozen=True)
class Unit:
    """One advertised device: a whole GPU, a MIG instance, or a replica of either."""

    id: str
    gpu_uuid: str  # the physical GPU it lives on
    visible_id: str  # the GPU or MIG UUID that a container is told of
    numa: int | None
    replica: int | None = None
    index: str = ""  # the same by index, as nvidia-smi numbers them: "0", or "0:1" for MIG


@dataclass(frozen=True)
class ResourcePlan:
    name: str
    units: tuple[Unit, ...]
    replicated: bool
    mps: bool = False  # replicas served through an MPS control daemon


def plan_resources(gpus: Sequence[Gpu], config: Config, source: str) -> list[ResourcePlan]:
    """Group the GPUs' units by resource name, as the MIG strategy and sharing say."""
    groups: dict[str, list[Unit]] = {}
    for name, unit in _base_units(gpus, config, source):
        groups.setdefault(name, []).append(unit)
    _check_shared_total(groups, config, source)  # before any replica is made
    _check_mps(gpus, groups, config, source)
    plans = [_shared(name, units, config) for name, units in sorted(groups.items())]
    names = [p.name for p in plans]
    for name in sorted({n for n in names if names.count(n) > 1}):
        # A rename onto a name the node already offers would serve two plugins as one.
        raise ConfigError(
            source,
            f"{config.sharing.key}.resources[].rename",
            f"a name no other GPU resource of this node has; {name} is offered twice",
        )
    return plans


def _check_shared_total(groups: dict[str, list[Unit]], config: Config, source: str) -> None:
    """Refuse more time-sliced devices than a node serves within its memory limit; the
    entry that goes past the bound is named."""
    total = 0
    for i, entry in enumerate(config.sharing.replicated.resources):
        devices = len(groups.get(entry.name, ()))
        total += devices * entry.replicas
        if total > MAX_SHARED_DEVICES:
            raise ConfigError(
                source,
                f"{config.sharing.key}.resources[{i}].replicas",
                f"at most {MAX_SHARED_DEVICES} time-sliced devices on a node; "
                f"{entry.replicas} replicas of each of {devices} {entry.name} devices "
                f"bring this node to {total}",
            )


def _check_mps(
    gpus: Sequence[Gpu], groups: dict[str, list[Unit]], config: Config, source: str
) -> None:
    """Refuse MPS on GPUs in MIG mode, as NVIDIA's plugin v0.20 refuses to start."""
    if not config.sharing.mps_active:
        return
    mig = {g.uuid for g in gpus if g.mig_enabled}
    shared = [r.name for r in config.sharing.replicated.resources]
    found = sorted({u.gpu_uuid for n in shared for u in groups.get(n, ()) if u.gpu_uuid in mig})
    if found:
        raise ConfigError(
            source,
            "sharing.mps",
            "GPUs without MIG mode: MPS does not share MIG devices; MIG is enabled on "
            + ", ".join(found),
        )


def _base_units(gpus: Sequence[Gpu], config: Config, source: str) -> list[tuple[str, Unit]]:
    strategy = config.flags.mig_strategy
    if strategy == "single" and not _check_single(gpus, source):
        strategy = "none"
    out = []
    for gpu in gpus:
        if strategy != "none" and gpu.mig_enabled:
            for n, mig in enumerate(gpu.mig):  # NVML's order: n is the MIG device index
                name = GPU_RESOURCE if strategy == "single" else MIG_PREFIX + mig.profile
                index = f"{gpu.index}:{n}"
                out.append((name, Unit(mig.uuid, gpu.uuid, mig.uuid, gpu.numa, index=index)))
            continue
        unit = Unit(gpu.uuid, gpu.uuid, gpu.uuid, gpu.numa, index=str(gpu.index))
        out.append((GPU_RESOURCE, unit))
    return out


def _check_single(gpus: Sequence[Gpu], source: str) -> bool:
    """Whether MIG instances are served under `single`: False on a node without MIG,
    whose whole GPUs are served instead, so that one config fits every node."""
    if gpus and not any(g.mig_enabled for g in gpus):
        log.warning(
            "mig_strategy_without_mig",
            strategy="single",
            effect="no GPU is in MIG mode: whole GPUs are served as " + GPU_RESOURCE,
        )
        return False
    profiles = {m.profile for g in gpus for m in g.mig}
    whole = [g.uuid for g in gpus if not g.mig_enabled]
    empty = [g.uuid for g in gpus if g.mig_enabled and not g.mig]
    if whole or empty or len(profiles) > 1:
        found = f"GPUs without MIG: {', '.join(whole)}; " if whole else ""
        found += f"MIG GPUs without instances: {', '.join(empty)}; " if empty else ""
        raise ConfigError(
            source,
            "flags.migStrategy",
            "single needs every GPU in MIG mode with one profile; "
            f"found {found}profiles {sorted(profiles) or 'none'}",
        )
    return True


def _shared(name: str, units: list[Unit], config: Config) -> ResourcePlan:
    sharing = config.sharing.replicated
    entry = sharing.replicas_for(name)
    if entry is None:
        return ResourcePlan(name, tuple(units), replicated=False)
    renamed = sharing.advertised_name(name)
    if entry.rename is not None:
        # Honoured here although the v1 format's own plugin ignores it: say so once.
        log.info("resource_renamed", resource=name, advertised=renamed, key="rename")
    replicas = tuple(
        Unit(f"{u.id}{REPLICA_SEPARATOR}{n}", u.gpu_uuid, u.visible_id, u.numa, n, u.index)
        for u in units
        for n in range(entry.replicas)
    )
    return ResourcePlan(renamed, replicas, replicated=True, mps=config.sharing.mps_active)
