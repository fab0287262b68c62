"""GPU<->NIC pairing for one resource of a container, whichever resource comes first.

Both kinds are handled alike: "this" kind is being chosen, "other" is the partner kind.
A device's partners are the other-kind devices at its smallest PCIe distance.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

EXACT_LIMIT = 500  # candidate sets scored exhaustively; beyond this, greedy (keeps p99 < 2 ms)
Tiebreak = Callable[[tuple[str, ...]], tuple[float, ...]]


@dataclass(frozen=True)
class PairView:
    """What is known when one resource of one container is asked for."""

    partners: Mapping[str, frozenset[str]]  # this-kind device -> nearest other-kind devices
    other_free: frozenset[str]  # other-kind devices believed free
    container_other: frozenset[str]  # other-kind devices this container already got
    this_free: frozenset[str]  # this-kind devices free now (the kubelet's available list)


def score(chosen: tuple[str, ...], view: PairView) -> tuple[int, ...]:
    """Lower is better: pairing with the container first, then keeping pairs whole."""
    partners = [view.partners.get(d, frozenset()) for d in chosen]
    if view.container_other:
        paired = sum(1 for p in partners if p & view.container_other)
        covered = sum(1 for o in view.container_other if any(o in p for p in partners))
        head: tuple[int, ...] = (-paired, -covered)
    else:
        with_free = [p & view.other_free for p in partners]
        paired = sum(1 for p in with_free if p)
        groups = len({p for p in with_free if p})
        # More free partners in all leaves the other resource more ways to pair.
        reach = len(frozenset().union(*with_free)) if with_free else 0
        head = (-paired, groups, -reach)
    return (*head, _left_behind(chosen, partners, view))


def _left_behind(chosen: tuple[str, ...], partners: list[frozenset[str]], view: PairView) -> int:
    """Free devices outside the choice that share partners with it: pairs broken up."""
    touched = frozenset().union(*partners) if partners else frozenset()
    picked = set(chosen)
    return sum(
        1 for d in view.this_free if d not in picked and view.partners.get(d, frozenset()) & touched
    )


def prefer(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    view: PairView,
    tiebreak: Tiebreak | None = None,
) -> list[str]:
    """The `size` devices that pair best; `tiebreak` ranks sets of equal pairing score."""
    fixed = tuple(sorted(must_include))
    pool = sorted(set(available) - set(fixed))
    need = size - len(fixed)
    if need <= 0:
        return list(fixed)

    def key(extra: tuple[str, ...]) -> tuple[object, ...]:
        chosen = fixed + extra
        tail = tiebreak(chosen) if tiebreak else ()
        return (score(chosen, view), tail, tuple(sorted(chosen)))

    if math.comb(len(pool), need) <= EXACT_LIMIT:
        best = min(itertools.combinations(pool, need), key=key)
    else:
        best = _greedy(pool, need, key)
    return sorted(fixed + best)


def _greedy(
    pool: list[str], need: int, key: Callable[[tuple[str, ...]], tuple[object, ...]]
) -> tuple[str, ...]:
    chosen: tuple[str, ...] = ()
    rest = list(pool)
    for _ in range(need):
        pick = min(rest, key=lambda d: key((*chosen, d)))
        chosen = (*chosen, pick)
        rest.remove(pick)
    return chosen
