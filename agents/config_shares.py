"""`sharing.shares` (docs/sharing.md#shares-under-dra): a GPU's memory and SMs handed out
in shares through DRA's consumable capacity, and how their limits are enforced."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

from agents.configschema import Section, bad, one_of
from agents.core.quantity import quantity

Enforce = Literal["mps", "none"]
ENFORCE: tuple[Enforce, ...] = ("mps", "none")
GIB = 2**30
MPS_ROOT = "/run/nvidia/mps"  # flags.mpsRoot where it is not given
KEYS = ("memoryStep", "enforce")


@dataclass(frozen=True)
class Shares:
    """Each whole GPU shared: memory asked for in `memory_step` bytes, limits enforced by
    MPS (`enforce: mps`, its pipes and shared memory under `mps_root`) or not at all."""

    memory_step: int = GIB
    enforce: Enforce = "mps"
    mps_root: str = MPS_ROOT
    by_claims: bool = False  # served where claims consume them (DRA); ignored elsewhere


def memory_step(value: object) -> int:
    """A whole number of bytes above 0, given as a quantity ("1Gi", "512Mi") or bytes."""
    text = str(value) if isinstance(value, int | str) and not isinstance(value, bool) else ""
    number = quantity(text) if text else text
    if not isinstance(number, Fraction) or number <= 0 or number.denominator != 1:
        raise bad("a quantity of bytes above 0 such as 1Gi", value)
    return int(number)


def parse_shares(sec: Section) -> Shares:
    """The section read (given, even empty: shares are on)."""
    return Shares(
        memory_step=sec.value("memoryStep", memory_step, GIB),
        enforce=sec.value("enforce", one_of(ENFORCE), "mps"),
    )
