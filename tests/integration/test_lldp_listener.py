"""LldpListener against the real kernel: LLDP frames sent from the far end of veth pairs
(each in a network namespace of its own) and heard on the host-side ends."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import structlog.testing

from agents.hw.lldp_listener import MALFORMED_LOG_S, RETRY_S, LldpListener
from tests.conditions import async_wait_until
from tests.lldp_frames import PeerSender, ethernet, frame, lldpdu, raw_tlv, tlv
from tests.veth import ip, veth_pair

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"
    ),
]

PEER = "lldpsw0"
DEADLINE_S = 10.0  # for a frame to be heard at all on a loaded 2-core machine
RSS_BOUND = 1 << 20  # what 1,000 malformed frames may add to the process's RSS


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Link:
    host: str  # the NIC's netdev, watched by the listener
    netns: str  # where the switch's end lives
    switch: PeerSender  # sends from that end


@contextmanager
def _link() -> Iterator[Link]:
    with veth_pair("nal", "na-lldp", PEER) as (host, netns), PeerSender(netns, PEER) as sender:
        yield Link(host, netns, sender)


@pytest.fixture
def link() -> Iterator[Link]:
    with _link() as made:
        yield made


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
async def listener(clock: Clock) -> AsyncIterator[LldpListener]:
    made = LldpListener(clock=clock)
    yield made
    made.close()


async def _changed(listener: LldpListener) -> bool:
    return await listener.next_change(DEADLINE_S)


async def _hears(listener: LldpListener, link: Link, raw: bytes, name: str) -> None:
    """Send `raw` until the listener holds a neighbour named `name` (a veth whose carrier
    is just coming up drops what it is given)."""

    def heard() -> bool:
        found = listener.neighbour(link.host)
        if found is None or found.system_name != name:
            link.switch.send(raw)
            return False
        return True

    await async_wait_until(heard, DEADLINE_S, f"{name} heard on {link.host}")


async def test_two_nics_each_hear_their_own_leaf(listener: LldpListener) -> None:
    with _link() as a, _link() as b:
        listener.watch([a.host, b.host])
        a.switch.send(frame(system_name="leaf-a", port_name="Ethernet1/1"))
        b.switch.send(frame(system_name="leaf-b", port_name="Ethernet1/2", port_description="x"))
        await async_wait_until(
            lambda: (
                listener.neighbour(a.host) is not None and listener.neighbour(b.host) is not None
            ),
            DEADLINE_S,
        )
        heard_a, heard_b = listener.neighbour(a.host), listener.neighbour(b.host)
        assert heard_a is not None and heard_b is not None
        assert (heard_a.leaf, heard_a.port_id, heard_a.ttl_s) == ("leaf-a", "Ethernet1/1", 120)
        assert (heard_b.leaf, heard_b.port_id, heard_b.port_description) == (
            "leaf-b",
            "Ethernet1/2",
            "x",
        )
        assert heard_a.chassis_id == "0c:42:a1:00:00:01"
        assert await listener.next_change(0)


async def test_a_nic_that_hears_nothing_has_no_neighbour(
    listener: LldpListener, link: Link
) -> None:
    listener.watch([link.host])
    assert not await listener.next_change(0.3)
    assert listener.neighbour(link.host) is None
    assert listener.neighbour("not-watched") is None


async def test_a_renamed_leaf_is_a_change_that_replaces_the_neighbour(
    listener: LldpListener, link: Link
) -> None:
    listener.watch([link.host])
    await _hears(listener, link, frame(system_name="leaf-a"), "leaf-a")
    assert await listener.next_change(0)
    link.switch.send(frame(system_name="leaf-a"))  # the same facts again: no change
    link.switch.send(frame(system_name="leaf-a-renamed"))
    assert await _changed(listener)
    heard = listener.neighbour(link.host)
    assert heard is not None and heard.system_name == "leaf-a-renamed"


async def test_a_name_over_63_characters_is_kept_whole(listener: LldpListener, link: Link) -> None:
    name = "leaf-" + "0123456789" * 20  # 205 characters
    listener.watch([link.host])
    await _hears(listener, link, frame(system_name=name), name)
    heard = listener.neighbour(link.host)
    assert heard is not None and heard.leaf == name


async def test_a_neighbour_expires_when_its_ttl_runs_out(
    listener: LldpListener, link: Link, clock: Clock
) -> None:
    listener.watch([link.host])
    await _hears(listener, link, frame(ttl_s=120), "leaf-a")
    assert await listener.next_change(0)
    clock.now += 119
    assert not await listener.next_change(0.05)
    assert listener.neighbour(link.host) is not None
    clock.now += 1
    assert listener.neighbour(link.host) is None
    assert await listener.next_change(DEADLINE_S)


async def test_a_short_ttl_expires_on_the_loops_own_timer(link: Link) -> None:
    listener = LldpListener()  # the real clock: the listener's timer must wake the wait
    try:
        listener.watch([link.host])
        await _hears(listener, link, frame(ttl_s=1), "leaf-a")
        await listener.next_change(0)
        assert await listener.next_change(DEADLINE_S)
        assert listener.neighbour(link.host) is None
    finally:
        listener.close()


async def test_a_zero_ttl_removes_the_neighbour_at_once(listener: LldpListener, link: Link) -> None:
    listener.watch([link.host])
    await _hears(listener, link, frame(), "leaf-a")
    await listener.next_change(0)
    link.switch.send(frame(ttl_s=0))
    assert await _changed(listener)
    assert listener.neighbour(link.host) is None


async def test_a_netdev_that_goes_down_keeps_its_neighbour_until_its_ttl(
    listener: LldpListener, link: Link, clock: Clock
) -> None:
    listener.watch([link.host])
    await _hears(listener, link, frame(), "leaf-a")
    assert await listener.next_change(0)
    ip("link", "set", link.host, "down")
    clock.now += RETRY_S  # the periodic check runs too, and finds the netdev still there
    assert not await listener.next_change(0.5)
    assert listener.neighbour(link.host) is not None
    ip("link", "set", link.host, "up")
    await _hears(listener, link, frame(system_name="leaf-after-up"), "leaf-after-up")


async def test_a_removed_netdev_loses_its_neighbour_and_is_heard_again_when_back(
    listener: LldpListener, link: Link, clock: Clock
) -> None:
    listener.watch([link.host])
    await _hears(listener, link, frame(), "leaf-a")
    await listener.next_change(0)
    ip("link", "del", link.host)

    async def gone() -> bool:
        clock.now += RETRY_S  # gone is seen from the socket's error, else at the next check
        return await listener.next_change(0.2) and listener.neighbour(link.host) is None

    async with asyncio.timeout(DEADLINE_S):
        while not await gone():
            pass
    ip("link", "add", link.host, "type", "veth", "peer", "name", PEER, "netns", link.netns)
    ip("link", "set", link.host, "up")
    ip("-n", link.netns, "link", "set", PEER, "up")
    clock.now += RETRY_S  # the retry binds the netdev of that name again
    assert not await listener.next_change(0)
    with PeerSender(link.netns, PEER) as switch:
        await _hears(listener, Link(link.host, link.netns, switch), frame(), "leaf-a")


async def test_watching_another_set_closes_and_opens_sockets(listener: LldpListener) -> None:
    with _link() as a, _link() as b:
        listener.watch([a.host, b.host])
        await _hears(listener, a, frame(system_name="leaf-a"), "leaf-a")
        await listener.next_change(0)
        listener.watch([b.host])
        assert await listener.next_change(0), "a's neighbour is gone with its watch"
        assert listener.neighbour(a.host) is None
        a.switch.send(frame(system_name="leaf-a"))
        await _hears(listener, b, frame(system_name="leaf-b"), "leaf-b")
        assert listener.neighbour(a.host) is None
        listener.watch([a.host, b.host])
        await _hears(listener, a, frame(system_name="leaf-a2"), "leaf-a2")


async def test_frames_this_host_sends_are_not_taken_for_a_neighbour(
    listener: LldpListener, link: Link
) -> None:
    listener.watch([link.host])
    await _hears(listener, link, frame(system_name="leaf-a"), "leaf-a")
    with socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0) as own:
        own.bind((link.host, 0))
        own.send(frame(system_name="this-host"))
    link.switch.send(ethernet(b"\x00\x01"))  # malformed: once counted, all before is read
    await async_wait_until(lambda: listener.malformed(link.host) == 1, DEADLINE_S)
    heard = listener.neighbour(link.host)
    assert heard is not None and heard.system_name == "leaf-a"


def _malformed(i: int) -> bytes:
    """One of several kinds of bad frame, its bytes varied by i."""
    name = f"leaf-{i}".encode()
    kinds = [
        ethernet(lldpdu()[: 5 + i % 20]),  # cut inside a TLV
        ethernet(raw_tlv(1, 300 + i % 200, b"\x04" + name)),  # a length past the end
        ethernet(tlv(2, b"\x05p") + tlv(1, b"\x04" + name) + tlv(3, b"\0\x05")),  # order
        ethernet(lldpdu(extra=tlv(1, b"\x07" + name))),  # a second Chassis ID
        ethernet(lldpdu(extra=tlv(9) * (520 + i % 50))),  # too many TLVs
        ethernet(b""),  # nothing at all
    ]
    return kinds[i % len(kinds)]


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _send_malformed(listener: LldpListener, link: Link, first: int, count: int) -> None:
    # In batches the socket's receive buffer holds, so every frame is read and counted.
    for start in range(first, first + count, 20):
        end = min(start + 20, first + count)
        for i in range(start, end):
            link.switch.send(_malformed(i))

        def refused(end: int = end) -> bool:
            return listener.malformed(link.host) >= end

        await async_wait_until(refused, DEADLINE_S, f"{end} refused")


async def test_a_thousand_malformed_frames_leave_the_listener_serving_and_rss_steady(
    listener: LldpListener, link: Link, clock: Clock
) -> None:
    listener.watch([link.host])
    with structlog.testing.capture_logs() as logs:
        await _send_malformed(listener, link, 0, 100)  # warm the allocator up
        before = _rss()
        await _send_malformed(listener, link, 100, 1000)
        grown = _rss() - before
        await _hears(listener, link, frame(system_name="leaf-after"), "leaf-after")
        clock.now += MALFORMED_LOG_S  # a minute later, the next bad frame is logged again
        await _send_malformed(listener, link, 1100, 1)
    assert listener.malformed(link.host) == 1101
    assert grown < RSS_BOUND, f"RSS grew by {grown} bytes"
    print(f"RSS growth over 1000 malformed frames: {grown} bytes")
    lines = [e for e in logs if e["event"] == "lldp_frame_malformed"]
    assert [(e["netdev"], e["count"]) for e in lines] == [(link.host, 1), (link.host, 1101)]
    assert "LLDPDU ends after 1 TLVs" in lines[0]["reason"]


PROBE = textwrap.dedent(
    """
    import asyncio, structlog.testing
    from agents.hw.lldp_listener import LldpListener

    async def main():
        with structlog.testing.capture_logs() as logs:
            listener = LldpListener()
            listener.watch(["lo"])
            listener.watch(["lo", "eth-none"])
            changed = await listener.next_change(0.1)
            listener.close()
        print([e["event"] for e in logs], changed, listener.neighbour("lo"))
        print(logs[0].get("reason"))

    asyncio.run(main())
    """
)


def test_without_cap_net_raw_it_says_so_once_and_hears_nothing() -> None:
    dropped = ["setpriv", "--bounding-set=-net_raw", "--inh-caps=-net_raw"]
    done = subprocess.run(
        [*dropped, sys.executable, "-c", PROBE],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    events, reason = done.stdout.splitlines()
    assert events == "['lldp_unavailable'] False None"
    assert "CAP_NET_RAW" in reason


class Pace:
    """The read budget's clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_flood_is_read_at_the_budget_and_the_rest_left_to_the_kernel(
    link: Link, clock: Clock
) -> None:
    pace = Pace()
    listener = LldpListener(clock=clock, pace=pace, frames_per_s=10)
    try:
        listener.watch([link.host])
        await _changed_or_not(listener)  # read on this loop from now on
        with structlog.testing.capture_logs() as logs:
            for i in range(50):
                link.switch.send(_malformed(i))

            def throttled() -> list[MutableMapping[str, Any]]:
                return [e for e in logs if e["event"] == "lldp_frames_throttled"]

            await async_wait_until(throttled, DEADLINE_S, "throttled")
            assert listener.malformed(link.host) == 10  # a second's budget, no more
            pace.now += 1.0  # a second later: ten more, from what the kernel still holds
            await async_wait_until(lambda: listener.malformed(link.host) == 20, DEADLINE_S)
        assert len(throttled()) == 1  # said once a minute, not once a frame
    finally:
        listener.close()


async def _changed_or_not(listener: LldpListener) -> None:
    await listener.next_change(0.0)
