"""The node's place waits for every RoCE NIC to hear its leaf (or a minute), so no label
names a leaf group the node is not in; per-NIC neighbours are known at once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from agents.config import Fabric
from agents.hw.lldp import Neighbour
from agents.roce.fabric_watch import FabricWatch

LEAF_A = Neighbour("b8:59:9f:0a:00:01", "Ethernet1/1", 120, "leaf-a")
LEAF_B = Neighbour("b8:59:9f:0b:00:01", "Ethernet1/1", 120, "leaf-b")


class Heard:
    """A NeighbourSource whose neighbours the test sets."""

    def __init__(self) -> None:
        self.heard: dict[str, Neighbour] = {}

    def watch(self, ifnames: Iterable[str]) -> None:
        pass

    def neighbour(self, ifname: str) -> Neighbour | None:
        return self.heard.get(ifname)

    async def next_change(self, timeout_s: float) -> bool:
        await asyncio.sleep(0)
        return False

    def close(self) -> None:
        pass


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def watching(source: Heard, clock: Clock) -> FabricWatch:
    watch = FabricWatch(source, Fabric(), clock=clock, unknown_after_s=60.0)
    watch.watch(["ens1np0", "ens2np0"])
    return watch


def test_the_leaf_group_waits_until_every_nic_has_heard_its_leaf() -> None:
    source, clock = Heard(), Clock()
    watch = watching(source, clock)
    source.heard["ens1np0"] = LEAF_A
    assert watch.refresh()
    assert watch.neighbours == {"ens1np0": LEAF_A}  # the NIC's own facts at once
    assert watch.labels() == {}  # but no group of one leaf when the node has two
    source.heard["ens2np0"] = LEAF_B
    assert watch.refresh()
    assert watch.labels() == {"network.node-agents.io/leaf-group": "leaf-a.leaf-b"}
    # Once settled, a NIC that loses its neighbour changes the group at once.
    del source.heard["ens2np0"]
    assert watch.refresh()
    assert watch.labels() == {"network.node-agents.io/leaf-group": "leaf-a"}


def test_after_a_minute_the_nics_that_heard_give_the_group() -> None:
    source, clock = Heard(), Clock()
    watch = watching(source, clock)
    source.heard["ens1np0"] = LEAF_A
    watch.refresh()
    clock.now += 59.9
    assert watch.labels() == {}
    clock.now += 0.1
    assert watch.labels() == {"network.node-agents.io/leaf-group": "leaf-a"}


async def test_the_watch_wakes_at_the_minute_to_publish_what_it_heard() -> None:
    source, clock = Heard(), Clock()
    watch = watching(source, clock)
    source.heard["ens1np0"] = LEAF_A
    watch.refresh()
    published = asyncio.Event()
    task = asyncio.create_task(watch.run(published.set))
    try:
        await asyncio.sleep(0)
        assert not published.is_set()
        clock.now += 60.0
        async with asyncio.timeout(5):
            await published.wait()
        assert watch.labels() == {"network.node-agents.io/leaf-group": "leaf-a"}
    finally:
        task.cancel()


def test_a_reloaded_family_goes_on_with_what_its_nics_heard() -> None:
    # A SIGHUP rebuilds the family: its slices must not lose the leaf attributes for a
    # moment, nor its node the labels.
    source, clock = Heard(), Clock()
    earlier = watching(source, clock)
    source.heard.update({"ens1np0": LEAF_A, "ens2np0": LEAF_B})
    earlier.refresh()
    later = FabricWatch(source, Fabric(), clock=clock, unknown_after_s=60.0)
    later.follow(earlier)
    assert later.neighbours == earlier.neighbours
    assert later.labels() == earlier.labels() != {}
    assert not later.watch(["ens1np0", "ens2np0"])  # nothing changed: nothing to publish
