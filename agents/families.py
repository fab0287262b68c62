"""The device families this agent can run, by name: the one list to extend."""

from __future__ import annotations

from agents.errors import ConfigError
from agents.family import AnyKind
from agents.gpu.kind import GpuKind
from agents.roce.kind import RoceKind

KINDS: tuple[AnyKind, ...] = (GpuKind(), RoceKind())


def parse_families(text: str | None) -> tuple[AnyKind, ...]:
    """The kinds named in a --families value ("gpu,roce"), in the order of KINDS; all of
    them when it is not given (None)."""
    if text is None:
        return KINDS
    by_name = {kind.name: kind for kind in KINDS}
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown or not names:
        raise ConfigError("--families", ",".join(unknown) or text, f"any of {', '.join(by_name)}")
    return tuple(kind for kind in KINDS if kind.name in names)
