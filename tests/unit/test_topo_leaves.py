"""How topo listens for the NICs' leaves on a real node: it stops once every NIC has heard,
gives up at the wait's end, redraws its progress line on a terminal, and says why it did
not listen. The neighbour source is a stand-in and the clock is injected."""

from __future__ import annotations

import io
from collections.abc import Iterable

from agents.hw.lldp import Neighbour
from agents.roce.discovery import Nic
from agents.topo_leaves import hear_leaves, refusal


class Wire:
    """A NeighbourSource whose next_change advances the clock and delivers what is due."""

    def __init__(self, due: dict[str, float]) -> None:
        self.now = 0.0
        self._due = due  # netdev -> when its frame arrives
        self.waits: list[float] = []

    def watch(self, ifnames: Iterable[str]) -> None: ...

    def neighbour(self, ifname: str) -> Neighbour | None:
        if self._due.get(ifname, float("inf")) > self.now:
            return None
        return Neighbour("0c:42:a1:00:00:01", "Ethernet1/1", 120, system_name=f"leaf-{ifname}")

    async def next_change(self, timeout_s: float) -> bool:
        self.waits.append(timeout_s)
        nearest = min([t for t in self._due.values() if t > self.now], default=float("inf"))
        self.now = min(self.now + timeout_s, nearest)
        return self.now == nearest

    def close(self) -> None: ...


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def nic(netdev: str) -> Nic:
    return Nic(
        pci=f"0000:{netdev}:00.0",
        rdma=f"mlx5_{netdev}",
        port=1,
        netdev=netdev,
        numa=0,
        uverbs="uverbs0",
        location=None,
    )


async def test_listening_stops_once_every_nic_has_heard() -> None:
    wire, err = Wire({"a": 1.5, "b": 2.5}), io.StringIO()
    leaves = await hear_leaves(
        wire,
        [nic("a"), nic("b")],
        ["a", "b"],
        wait_s=31,
        why_not=None,
        err=err,
        simulated=False,
        clock=lambda: wire.now,
    )
    assert {i: n.leaf for i, n in leaves.neighbours.items()} == {"a": "leaf-a", "b": "leaf-b"}
    assert wire.now == 2.5
    assert leaves.source == "LLDP heard by topo: 2 of 2 NICs in 2.5 s"
    assert err.getvalue().splitlines() == [
        "node-agent topo: listening for LLDP on 2 NICs, up to 31 s (--lldp-wait): 0 heard, "
        "31 s left",
        "node-agent topo: LLDP heard by topo: 2 of 2 NICs in 2.5 s",
    ]


async def test_a_terminal_sees_the_line_redrawn_and_the_wait_runs_out() -> None:
    wire, err = Wire({"a": 0.5}), Terminal()
    leaves = await hear_leaves(
        wire,
        [nic("a"), nic("b")],
        ["a", "b"],
        wait_s=3,
        why_not=None,
        err=err,
        simulated=False,
        clock=lambda: wire.now,
    )
    assert set(leaves.neighbours) == {"a"}
    assert wire.now == 3
    assert leaves.source == "LLDP heard by topo: 1 of 2 NICs in 3.0 s, the rest heard nothing"
    drawn = err.getvalue()
    assert drawn.count("\r\x1b[K") == 1 + len(wire.waits)  # each redraw, then the end
    assert "1 heard, 2 s left" in drawn
    assert drawn.endswith(
        "\r\x1b[Knode-agent topo: LLDP heard by topo: 1 of 2 NICs in 3.0 s (--lldp-wait 3)\n"
    )


async def test_not_listening_says_why_once_and_hears_nothing() -> None:
    err = io.StringIO()
    why = refusal(0)
    leaves = await hear_leaves(
        None, [nic("a")], ["a"], wait_s=0, why_not=why, err=err, simulated=False
    )
    assert leaves.neighbours == {}
    assert leaves.source == "LLDP not listened for (--lldp-wait 0)"
    assert err.getvalue() == ""  # asked for: nothing to say
    refused = "not listened for: that needs CAP_NET_RAW (run topo as root)"
    leaves = await hear_leaves(
        None, [nic("a")], ["a"], wait_s=31, why_not=refused, err=err, simulated=False
    )
    assert leaves.source == f"LLDP {refused}"
    assert err.getvalue() == f"node-agent topo: LLDP {refused}; the leaf column shows -\n"


async def test_a_node_without_roce_nics_has_no_leaf_source() -> None:
    leaves = await hear_leaves(
        None, [], [], wait_s=31, why_not=None, err=io.StringIO(), simulated=False
    )
    assert leaves.source is None
