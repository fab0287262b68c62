"""GFD v0.20's per-resource labels (product, count, replicas, sharing) and its MIG labels
for the single and mixed strategies; agents/core/gfd_labels.py puts them together."""

from __future__ import annotations

import re

from agents.core.gfd_facts import GpuFacts, MigLabels, Sharing

_FULL_GPU = "nvidia.com/gpu"
_UNSAFE = re.compile(r"[^A-Za-z0-9-_. ]")


def gfd_profile(profile: str) -> str:
    """A MIG profile as GFD names it: "1g.10gb+me" -> "1g.10gb.me"."""
    return profile.replace("+", ".")


def resource_labels(
    resource: str, sharing: Sharing | None, count: int, *parts: str
) -> dict[str, str]:
    """product, count, replicas and sharing-strategy of one resource. `sharing` None: a
    MIG-enabled GPU's own labels, which GFD writes without sharing (replicas 0)."""
    if count == 0:
        return {}
    listed = sharing.replicas.get(resource, 0) if sharing is not None else 0
    replicas = 0 if sharing is None else (listed if listed > 0 else 1)
    strategy = sharing.strategy if sharing is not None and replicas > 1 else "none"
    shared = sharing is not None and listed > 1 and not sharing.rename_by_default
    return {
        f"{resource}.product": product_name(parts, shared=shared),
        f"{resource}.count": str(count),
        f"{resource}.replicas": str(replicas),
        f"{resource}.sharing-strategy": strategy,
    }


def sanitise(text: str) -> str:
    """GFD's label value: characters other than [A-Za-z0-9-_. ] dropped, runs of spaces
    as one '-'."""
    return "-".join(_UNSAFE.sub("", text).split())


def product_name(parts: tuple[str, ...], *, shared: bool) -> str:
    clean = [sanitise(p) for p in parts if p]
    if clean and shared:
        clean.append("SHARED")
    return "-".join(clean)


def mig_strategy_labels(
    gpus: tuple[GpuFacts, ...], strategy: str, sharing: Sharing
) -> dict[str, str]:
    labels = {"nvidia.com/mig.strategy": strategy}
    if strategy == "single":
        labels |= _single(gpus, sharing)
    elif strategy == "mixed":
        for profile, (parent, mig, count) in sorted(_by_profile(gpus).items()):
            labels |= _mig_resource(f"nvidia.com/mig-{profile}", sharing, count, parent, mig)
    return labels


def _single(gpus: tuple[GpuFacts, ...], sharing: Sharing) -> dict[str, str]:
    """One MIG profile on every GPU: it stands for nvidia.com/gpu; anything else (an
    empty MIG GPU, a GPU without MIG beside, several profiles) is labelled INVALID."""
    enabled = [g for g in gpus if g.mig_enabled]
    if not enabled:
        return {}
    profiles = _by_profile(gpus)
    mixed = any(not g.migs for g in enabled) or any(not g.mig_enabled for g in gpus)
    if mixed or len(profiles) != 1:
        return _invalid(enabled[0].name)
    [(parent, mig, count)] = profiles.values()
    return _mig_resource(_FULL_GPU, sharing, count, parent, mig)


def _invalid(model: str) -> dict[str, str]:
    return {
        f"{_FULL_GPU}.product": product_name((model, "MIG", "INVALID"), shared=False),
        f"{_FULL_GPU}.count": "0",
        f"{_FULL_GPU}.replicas": "0",
        f"{_FULL_GPU}.sharing-strategy": "",
        f"{_FULL_GPU}.memory": "0",
    }


def _by_profile(gpus: tuple[GpuFacts, ...]) -> dict[str, tuple[str, MigLabels, int]]:
    """Each MIG profile on the node: its first device's parent model and attributes, and
    how many there are."""
    out: dict[str, tuple[str, MigLabels, int]] = {}
    for gpu in gpus:
        for mig in gpu.migs if gpu.mig_enabled else ():
            parent, first, count = out.get(mig.profile, (gpu.name, mig, 0))
            out[mig.profile] = (parent, first, count + 1)
    return out


def _mig_resource(
    resource: str, sharing: Sharing, count: int, parent: str, mig: MigLabels
) -> dict[str, str]:
    labels = resource_labels(resource, sharing, count, parent, "MIG", mig.profile)
    labels |= {f"{resource}.{key}": str(value) for key, value in mig.attributes().items()}
    return labels
