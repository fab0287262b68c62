"""The pairing score of a choice counted per class of alike devices, with bounds on what
a partial choice can still reach: what the searches of `agents.core.pairing` go by.

Other-kind devices are bits. Devices with the same partner mask and the same freedom
score alike, so a choice is a count per class, and a state carries the sums that
`agents.core.pairing.score` computes from a whole set.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import NamedTuple

Score = tuple[int, ...]
Kind = tuple[int, bool]  # (partner mask, among the free devices of its kind)


class State(NamedTuple):
    paired: int = 0  # devices taken with a partner in the container (else: a free partner)
    touched: int = 0  # partners of the devices taken
    groups: int = 0  # bits of the distinct free-partner sets taken (no container yet)
    mine: int = 0  # free devices taken that have partners


class _Ahead(NamedTuple):
    """What the bounds need of the classes from one position on."""

    group_sizes: list[tuple[int, int]]  # (free-partner set bit, devices), largest first
    gains: list[tuple[int, int]]  # (bits `covered` or `reach` counts, devices)
    gains_disjoint: bool  # no two classes share such a bit
    mine: list[tuple[int, int]]  # (partners, devices) of the classes that count as mine


@dataclass(frozen=True)
class Context:
    """What the score needs of a request besides the classes to choose from, as bits."""

    fixed: tuple[Kind, ...]  # the must-include devices
    container: int | None  # partners the container already got; None before it has any
    other_free: int  # partners believed free
    free_masks: Mapping[int, int]  # free devices of this kind by partner mask


class Scoring:
    """The score of counts taken from classes of `kinds` (in search order), and bounds."""

    def __init__(self, kinds: Sequence[Kind], caps: Sequence[int], context: Context) -> None:
        self.in_container = context.container is not None
        self.free_masks = context.free_masks
        self.caps = list(caps)
        # In a container, pairing counts with its devices; before, with free partners.
        target = context.other_free if context.container is None else context.container
        self.target = target
        sets = {m & target for m, _ in (*kinds, *context.fixed)} - {0}
        self._group_bit = {} if self.in_container else {g: 1 << n for n, g in enumerate(sets)}
        self._near: dict[int, int] = {0: 0}
        self._ahead: dict[int, _Ahead] = {}
        self._spill: dict[int, list[int]] = {}
        self.masks = [m for m, _ in kinds]
        self.mine = [free and m != 0 for m, free in kinds]
        self.gain = [m & target for m in self.masks]  # what `covered` or `reach` counts
        self.hit = [g != 0 for g in self.gain]
        self.group = [self._group_bit.get(g, 0) for g in self.gain]
        self.room = _suffix_sums(self.caps)
        self.hit_room = _suffix_sums([c * h for c, h in zip(self.caps, self.hit, strict=True)])
        self.other_room = _suffix_sums([c * (not m) for c, m in zip(caps, self.mine, strict=True)])
        self.masks_or = _suffix_or(self.masks)
        self.masks_and = list(accumulate(reversed(self.masks), int.__and__, initial=-1))[::-1]
        self.gain_or = _suffix_or(self.gain)
        self.group_or = _suffix_or(self.group)
        self.start = State()
        for kind in context.fixed:
            self.start = self.add(self.start, kind)
        sigs = signatures(kinds, self.caps, context, target)
        self.same_as_previous = [False] + [
            a is not None and a == b for a, b in zip(sigs[1:], sigs, strict=False)
        ]

    def with_interchangeable(self, classes: set[int]) -> set[int]:
        """`classes` and every class interchangeable with one of them."""
        run, runs = 0, []
        for i, same in enumerate(self.same_as_previous):
            run = run if same else i
            runs.append(run)
        wanted = {runs[i] for i in classes}
        return {i for i, r in enumerate(runs) if r in wanted}

    def add(self, s: State, kind: Kind) -> State:
        """The state after taking one device of `kind`."""
        mask, free = kind
        gain = mask & self.target
        return State(
            s.paired + (gain != 0),
            s.touched | mask,
            s.groups | self._group_bit.get(gain, 0),
            s.mine + (free and mask != 0),
        )

    def step(self, s: State, i: int, take: int) -> State:
        """The state after taking `take` devices of class i."""
        return State(
            s.paired + take if self.hit[i] else s.paired,
            s.touched | self.masks[i],
            s.groups | self.group[i],
            s.mine + take if self.mine[i] else s.mine,
        )

    def near(self, touched: int) -> int:
        """Free devices that share a partner with `touched`."""
        near = self._near.get(touched)
        if near is None:
            near = sum(c for m, c in self.free_masks.items() if m & touched)
            self._near[touched] = near
        return near

    def value(self, s: State) -> Score:
        """Lower is better: as `agents.core.pairing.score` of the devices taken."""
        left = self.near(s.touched) - s.mine
        gained = (s.touched & self.target).bit_count()
        if self.in_container:
            return (-s.paired, -gained, left)
        return (-s.paired, s.groups.bit_count(), -gained, left)

    def spans(self, s: State, i: int, left: int) -> Iterator[tuple[int, int]]:
        """(lowest, highest) of each score component in turn, over the ways to take
        `left` more devices from classes i..; lazily, as callers often stop early."""
        hits = self.hit_room[i]
        yield (-s.paired - min(left, hits), -s.paired - max(0, left - self.room[i] + hits))
        ahead = self._ahead.get(i) or self._look_ahead(i)
        if not self.in_container:
            groups = s.groups.bit_count()
            new = (self.group_or[i] & ~s.groups).bit_count()
            fewest = _fewest_new_groups(ahead.group_sizes, s.groups, left - self.room[i])
            yield (groups + fewest, groups + min(left, new))
        gained = s.touched & self.target
        count = gained.bit_count()
        union = (self.gain_or[i] & ~gained).bit_count()
        most, fewest = _new_gains(ahead, gained, left, union, self.room[i])
        yield (-count - most, -count - fewest)
        t = s.touched
        behind = self.near(t) - s.mine
        back = sum(cap for m, cap in ahead.mine if m & t)
        # Taking more only touches more, at least the partners all classes ahead share;
        # each device taken that counts as mine is one fewer left behind.
        shared = self.near(t | self.masks_and[i]) - s.mine - left if left else behind
        least = max(behind - min(left, back), shared)
        most = self.near(t | self.masks_or[i]) - s.mine - max(0, left - self.other_room[i])
        if most > least:
            most = min(most, behind + self._spilled(i, left))
        yield (least, most)

    def _spilled(self, i: int, left: int) -> int:
        """The most free devices that drawing on `left` classes from i on can leave
        behind sharing their partners (each drawn on is taken from at least once)."""
        spill = self._spill.get(i)
        if spill is None:
            each = (
                self.near(m) - mine for m, mine in zip(self.masks[i:], self.mine[i:], strict=True)
            )
            spill = list(accumulate(sorted(each, reverse=True), initial=0))
            self._spill[i] = spill
        return spill[min(left, len(spill) - 1)]

    def _look_ahead(self, i: int) -> _Ahead:
        sizes: dict[int, int] = {}
        for g, cap in zip(self.group[i:], self.caps[i:], strict=True):
            if g:
                sizes[g] = sizes.get(g, 0) + cap
        gains = [(g, cap) for g, cap in zip(self.gain[i:], self.caps[i:], strict=True) if g]
        ahead = _Ahead(
            sorted(sizes.items(), key=lambda gc: -gc[1]),
            gains,
            sum(g.bit_count() for g, _ in gains) == self.gain_or[i].bit_count(),
            [
                (m, c)
                for m, c, mine in zip(self.masks[i:], self.caps[i:], self.mine[i:], strict=True)
                if mine
            ],
        )
        self._ahead[i] = ahead
        return ahead

    def can_reach(self, s: State, i: int, left: int, target: Score) -> bool:
        """Whether some way to take `left` more from classes i.. may score `target`."""
        return all(
            lo <= t <= hi for (lo, hi), t in zip(self.spans(s, i, left), target, strict=True)
        )

    def settled(self, s: State, i: int, left: int) -> Score | None:
        """The score every way to take `left` more from classes i.. has, if the bounds
        prove there is only one; else None."""
        lows = []
        for lo, hi in self.spans(s, i, left):
            if lo != hi:
                return None
            lows.append(lo)
        return tuple(lows)


def signatures(
    kinds: Sequence[Kind], caps: Sequence[int], context: Context, target: int
) -> list[tuple[int, ...] | None]:
    """What the score sees of each class, where that is all it sees: the class alone has
    its partners (no other device of either list, nor a free one, shares any of them).
    Taking t devices of one such class or t of another with the same signature then
    scores the same, whatever else is taken."""
    masks = [m for m, _ in kinds]
    distinct = {*masks, *(m for m, _ in context.fixed), *context.free_masks}
    seen = shared = 0
    for m in distinct:
        shared |= seen & m
        seen |= m
    fixed = 0
    for m, _ in context.fixed:
        fixed |= m
    repeated = {m for m in masks if masks.count(m) > 1}
    return [
        None
        if not m or m & shared or m in repeated
        else (free, cap, (m & target).bit_count(), context.free_masks.get(m, 0), bool(m & fixed))
        for (m, free), cap in zip(kinds, caps, strict=True)
    ]


def _fewest_new_groups(sizes: list[tuple[int, int]], groups: int, short: int) -> int:
    """The fewest free-partner sets not taken yet that must be drawn on: `short` is how
    many more devices are wanted than all classes hold, less those of new sets."""
    short += sum(cap for g, cap in sizes if not g & groups)
    count = 0
    for g, cap in sizes:
        if short <= 0:
            break
        if not g & groups:
            short -= cap
            count += 1
    return count


def _new_gains(ahead: _Ahead, gained: int, left: int, union: int, room: int) -> tuple[int, int]:
    """The most and (a bound on) the fewest new bits that `left` more devices (of `room`
    ahead) add to `gained`; a class adds its bits once, however many of it are taken."""
    news = [((g & ~gained).bit_count(), cap) for g, cap in ahead.gains]
    most = min(sum(sorted((n for n, _ in news), reverse=True)[:left]), union)
    if not ahead.gains_disjoint:
        return most, 0  # classes share bits: a device may add none
    # Disjoint bits: devices beyond those of classes that add none come from classes
    # that add at least the fewest any adds, as many classes as the largest would need.
    short = left - room + sum(cap for n, cap in news if n)
    fewest, least = 0, min((n for n, _ in news if n), default=0)
    for cap in sorted((cap for n, cap in news if n), reverse=True):
        if short <= 0:
            break
        short -= cap
        fewest += least
    return most, fewest


def _suffix_sums(values: Sequence[int]) -> list[int]:
    return list(accumulate(reversed(values), initial=0))[::-1]


def _suffix_or(values: Sequence[int]) -> list[int]:
    return list(accumulate(reversed(values), int.__or__, initial=0))[::-1]
