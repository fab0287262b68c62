"""LldpListener hearing Debian's lldpd, a real LLDP agent, run at the far end of a veth in
a network namespace of its own: what it says, and its shutdown frame when it stops."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator

import pytest

from agents.hw.lldp_listener import LldpListener
from tests.conditions import async_wait_until
from tests.veth import lldpd_switch

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"
    ),
]

PEER = "lldpsw1"
DEADLINE_S = 10.0  # lldpd sends its first frame within a second of starting


@pytest.fixture
def lldpd_peer() -> Iterator[tuple[str, str, subprocess.Popen[bytes]]]:
    """(host netdev, the peer's MAC, lldpd) with lldpd sending every second on the peer
    as the switch `leaf-lldpd`; stopped (and its veth removed) afterwards."""
    with lldpd_switch("nad", "na-lldpd", PEER) as peer:
        yield peer


async def test_a_real_lldpd_is_heard_and_its_shutdown_frame_removes_it(
    lldpd_peer: tuple[str, str, subprocess.Popen[bytes]],
) -> None:
    host, mac, lldpd = lldpd_peer
    # The listener's clock stands still: no TTL runs out, so the neighbour can only go
    # by lldpd's goodbye frame (TTL 0).
    listener = LldpListener(clock=lambda: 0.0)
    try:
        listener.watch([host])
        await async_wait_until(lambda: listener.neighbour(host) is not None, DEADLINE_S)
        heard = listener.neighbour(host)
        assert heard is not None
        assert (heard.leaf, heard.chassis_id, heard.port_description) == ("leaf-lldpd", mac, PEER)
        assert heard.ttl_s == 4  # lldpd's TTL is tx-interval times its hold multiplier, 4
        assert listener.malformed(host) == 0
        await listener.next_change(0)
        lldpd.send_signal(signal.SIGTERM)  # lldpd says goodbye with a TTL of 0
        # It ends; its exit status is lldpd's own business: seen 1 instead of 0 in two
        # full runs on a loaded machine, never alone; the goodbye frame is what counts.
        lldpd.wait(DEADLINE_S)
        assert listener.neighbour(host) is None or await listener.next_change(DEADLINE_S)
        assert listener.neighbour(host) is None
    finally:
        listener.close()
