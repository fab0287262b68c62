"""One measured figure against its target, and the table and JSON they print as."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Figure:
    """`ok` is None when there is no target or the figure could not be measured."""

    name: str
    value: float | None
    unit: str
    target: str = ""
    ok: bool | None = None
    note: str = ""

    @property
    def shown(self) -> str:
        if self.value is None:
            return "skipped"
        if self.unit == "%":
            return f"{self.value:.1f} %"
        if self.unit in ("ms", "s", "MB"):
            return f"{self.value:.2f} {self.unit}"
        return f"{self.value:g} {self.unit}".strip()

    @property
    def verdict(self) -> str:
        return {True: "pass", False: "FAIL", None: "-"}[self.ok]


def below(name: str, value: float, unit: str, limit: float, note: str = "") -> Figure:
    return Figure(name, value, unit, f"< {limit:g} {unit}", value < limit, note)


def at_least(name: str, value: float, unit: str, limit: float, note: str = "") -> Figure:
    return Figure(name, value, unit, f">= {limit:g} {unit}", value >= limit, note)


def info(name: str, value: float, unit: str, note: str = "") -> Figure:
    return Figure(name, value, unit, note=note)


def skipped(name: str, target: str, note: str) -> Figure:
    return Figure(name, None, "", target, None, note)


def markdown(rows: Sequence[Sequence[str]]) -> str:
    """`rows` (the first the header) as a Markdown table with padded columns: it reads in
    a terminal and renders in the README."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def table(figures: Sequence[Figure]) -> str:
    """The figures with their targets and verdicts, and their notes below."""
    rows = [("figure", "value", "target", "result")]
    rows += [(f.name, f.shown, f.target, f.verdict) for f in figures]
    notes = [f"- {f.name}: {f.note}" for f in figures if f.note]
    return "\n".join([markdown(rows), *(["", *notes] if notes else [])])


def as_json(figures: Sequence[Figure], machine: dict[str, str]) -> str:
    return json.dumps({"machine": machine, "figures": [asdict(f) for f in figures]}, indent=2)
