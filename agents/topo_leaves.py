"""How `node-agent topo` learns the leaf switch of each RoCE NIC: it listens for LLDP on the
NICs' netdevs itself, up to --lldp-wait seconds, and says where the leaf column came from."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from agents.hw.lldp import Neighbour, NeighbourSource
from agents.roce.discovery import Nic

PROGRESS_EVERY_S = 1.0  # how often a terminal's progress line is redrawn


@dataclass(frozen=True)
class Leaves:
    """Each NIC's neighbour by netdev, and where they came from (None: no RoCE NIC)."""

    neighbours: dict[str, Neighbour]
    source: str | None


def refusal(wait_s: float) -> str | None:
    """Why topo will not listen for LLDP here; None when it will. An AF_PACKET socket that
    hears nothing yet tells whether this process has CAP_NET_RAW."""
    if wait_s <= 0:
        return "not listened for (--lldp-wait 0)"
    try:
        socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close()
    except PermissionError:
        return "not listened for: that needs CAP_NET_RAW (run topo as root)"
    except OSError as exc:
        return f"not listened for: {exc.strerror or exc}"
    return None


def on_host(netdev: str) -> bool:
    """Whether the netdev exists here, so that frames can be heard on it (a simulated NIC's
    netdev exists only where a test made it, a veth)."""
    try:
        socket.if_nametoindex(netdev)
    except OSError:
        return False
    return True


async def hear_leaves(
    lldp: NeighbourSource | None,
    nics: list[Nic],
    wired: list[str],
    *,
    wait_s: float,
    why_not: str | None,
    err: TextIO,
    simulated: bool,
    clock: Callable[[], float] = time.monotonic,
) -> Leaves:
    """The NICs' neighbours once every netdev in `wired` (those on this host, watched by
    `lldp` since before) has heard one, or wait_s has passed; not listened for where
    `why_not` says why (said in one line on `err` when there was a netdev to listen on)."""
    if not nics:
        return Leaves({}, None)
    listened: str | None = None
    if wired and why_not is None and lldp is not None:
        listened = await _listen(lldp, wired, wait_s, err, clock)
    elif wired and why_not is not None and wait_s > 0:
        err.write(f"node-agent topo: LLDP {why_not}; the leaf column shows -\n")
    heard = {} if lldp is None else {n.netdev: lldp.neighbour(n.netdev) for n in nics}
    neighbours = {i: n for i, n in heard.items() if n is not None}
    parts = ["the node file"] if simulated else []
    if wired:
        parts.append(listened or f"LLDP {why_not}")
    elif not simulated:
        parts.append(f"LLDP {why_not}" if why_not else "LLDP: no NIC's netdev is on this host")
    return Leaves(neighbours, "; ".join(parts))


async def _listen(
    lldp: NeighbourSource, wired: list[str], wait_s: float, err: TextIO, clock: Callable[[], float]
) -> str:
    """Wait until every wired netdev has heard its neighbour or wait_s has passed, with a
    progress line on `err`; what was heard, for the report."""
    start = clock()
    progress = _Progress(err, len(wired), wait_s)
    while True:
        heard = sum(lldp.neighbour(i) is not None for i in wired)
        left = start + wait_s - clock()
        if heard == len(wired) or left <= 0:
            break
        progress.show(heard, left)
        await lldp.next_change(min(left, PROGRESS_EVERY_S))
    took = clock() - start
    said = f"LLDP heard by topo: {heard} of {len(wired)} NICs in {took:.1f} s"
    progress.done(said if heard == len(wired) else f"{said} (--lldp-wait {wait_s:g})")
    return said if heard == len(wired) else f"{said}, the rest heard nothing"


class _Progress:
    """One line on stderr while topo listens: redrawn in place on a terminal; elsewhere
    (a log, a test) written once as listening starts and once as it ends."""

    def __init__(self, err: TextIO, nics: int, wait_s: float) -> None:
        self._err, self._nics, self._wait_s = err, nics, wait_s
        self._tty = err.isatty()
        self._started = False

    def show(self, heard: int, left_s: float) -> None:
        text = (
            f"node-agent topo: listening for LLDP on {self._nics} NICs, up to {self._wait_s:g} s "
            f"(--lldp-wait): {heard} heard, {left_s:.0f} s left"
        )
        if self._tty:
            self._err.write(f"\r\x1b[K{text}")
        elif not self._started:
            self._err.write(text + "\n")
        self._started = True
        self._err.flush()

    def done(self, text: str) -> None:
        redraw = "\r\x1b[K" if self._tty else ""
        self._err.write(f"{redraw}node-agent topo: {text}\n")
        self._err.flush()
