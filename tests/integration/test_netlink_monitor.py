"""NetlinkMonitor against the real kernel: a veth pair in a network namespace of its own."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import structlog.testing

from agents.errors import BackendError
from agents.hw.netlink import LinkState, NetlinkMonitor
from tests.conditions import async_wait_until, wait_until

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("ip") is None, reason="needs root and iproute2"
    ),
]

# A deadline for the change to be seen at all, wide enough for a loaded 2-core machine
# (it includes spawning `ip`); how fast it is seen is measured by hack/bench.
CHANGE_DEADLINE_S = 10.0


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


def _operstate(netns: str, ifname: str) -> str:
    [link] = json.loads(_ip("-j", "-n", netns, "link", "show", ifname))
    return str(link["operstate"])


@pytest.fixture
def netns() -> Iterator[str]:
    """A fresh namespace holding veth pair va <-> vb, both up; removed afterwards."""
    name = f"na-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    _ip("netns", "add", name)
    try:
        _ip("-n", name, "link", "add", "va", "type", "veth", "peer", "name", "vb")
        _ip("-n", name, "link", "set", "va", "up")
        _ip("-n", name, "link", "set", "vb", "up")
        # The kernel turns a veth's operstate UP from a deferred work item, up to a second
        # later; a test starts from the state it assumes, not from a half-made pair.
        wait_until(
            lambda: _operstate(name, "va") == "UP" and _operstate(name, "vb") == "UP",
            what="veth pair operstate UP",
        )
        yield name
    finally:
        _ip("netns", "del", name)


@pytest.fixture
async def monitor(netns: str) -> AsyncIterator[NetlinkMonitor]:
    mon = NetlinkMonitor(netns)
    await async_wait_until(lambda: mon.state("va") is LinkState.UP, what="va up")
    await async_wait_until(lambda: mon.state("vb") is LinkState.UP, what="vb up")
    await _settle(mon)
    yield mon
    mon.close()


async def _settle(mon: NetlinkMonitor) -> None:
    """Take changes already signalled, so that the next True is caused by the test."""
    while await mon.next_change(0.05):
        pass


async def _ip_async(*args: str) -> None:
    proc = await asyncio.create_subprocess_exec("ip", *args)
    assert await proc.wait() == 0, f"ip {' '.join(args)} failed"


async def _change_and_wait(
    mon: NetlinkMonitor, netns: str, cmd: list[str], ifname: str, want: LinkState
) -> float:
    """Run `ip -n netns <cmd>` and wait on next_change until ifname is `want`.

    Returns the milliseconds from the `ip` call to the state change; fails the test past
    CHANGE_DEADLINE_S or when next_change never reported True.
    """
    assert mon.state(ifname) is not want, f"{ifname} is already {want} before ip {cmd}"
    started = time.monotonic()
    deadline = started + CHANGE_DEADLINE_S
    ip = asyncio.create_task(_ip_async("-n", netns, *cmd))
    saw_change = False
    while mon.state(ifname) is not want:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"{ifname} not {want} within {CHANGE_DEADLINE_S}s of ip {cmd}"
        saw_change |= await mon.next_change(remaining)
    latency_ms = (time.monotonic() - started) * 1000
    await ip
    assert saw_change, "next_change() never returned True"
    print(f"\nnetlink latency, ip {' '.join(cmd)} -> {ifname} {want.value}: {latency_ms:.1f} ms")
    return latency_ms


async def test_initial_states_come_from_the_dump(monitor: NetlinkMonitor) -> None:
    assert monitor.state("va") is LinkState.UP
    assert monitor.state("vb") is LinkState.UP
    assert monitor.state("lo") is LinkState.DOWN  # a new namespace's loopback is down
    assert monitor.state("nope0") is LinkState.ABSENT


async def test_peer_down_and_up_is_seen_as_carrier_loss_and_return(
    monitor: NetlinkMonitor, netns: str
) -> None:
    await _change_and_wait(monitor, netns, ["link", "set", "vb", "down"], "va", LinkState.DOWN)
    await _change_and_wait(monitor, netns, ["link", "set", "vb", "up"], "va", LinkState.UP)


async def test_admin_down_of_the_interface_itself_is_down(
    monitor: NetlinkMonitor, netns: str
) -> None:
    await _change_and_wait(monitor, netns, ["link", "set", "va", "down"], "va", LinkState.DOWN)
    assert monitor.state("vb") is LinkState.DOWN  # its carrier went with va


async def test_deleted_interface_is_absent(monitor: NetlinkMonitor, netns: str) -> None:
    await _change_and_wait(monitor, netns, ["link", "del", "va"], "va", LinkState.ABSENT)
    await async_wait_until(lambda: monitor.state("vb") is LinkState.ABSENT, what="peer gone")


async def test_renamed_interface_is_absent_under_its_old_name(
    monitor: NetlinkMonitor, netns: str
) -> None:
    await _change_and_wait(monitor, netns, ["link", "set", "va", "down"], "va", LinkState.DOWN)
    await _change_and_wait(
        monitor, netns, ["link", "set", "va", "name", "vc"], "vc", LinkState.DOWN
    )
    assert monitor.state("va") is LinkState.ABSENT
    await _change_and_wait(monitor, netns, ["link", "set", "vc", "up"], "vc", LinkState.UP)


async def test_next_change_times_out_false_when_nothing_changes(
    monitor: NetlinkMonitor,
) -> None:
    started = time.monotonic()
    assert await monitor.next_change(0.1) is False
    assert time.monotonic() - started >= 0.09


async def test_change_before_the_wait_is_not_lost(monitor: NetlinkMonitor, netns: str) -> None:
    await _ip_async("-n", netns, "link", "set", "vb", "down")
    await async_wait_until(lambda: monitor.state("va") is LinkState.DOWN, what="va down")
    assert await monitor.next_change(CHANGE_DEADLINE_S) is True


async def test_monitor_built_outside_the_loop_attaches_on_first_wait(netns: str) -> None:
    mon = await asyncio.to_thread(NetlinkMonitor, netns)
    try:
        assert mon.state("va") is LinkState.UP
        await _settle(mon)
        await _change_and_wait(mon, netns, ["link", "set", "vb", "down"], "va", LinkState.DOWN)
    finally:
        mon.close()


async def test_close_is_idempotent_and_later_waits_fail(netns: str) -> None:
    mon = NetlinkMonitor(netns)
    mon.close()
    mon.close()
    with pytest.raises(BackendError, match="closed"):
        await mon.next_change(0.01)


def test_missing_namespace_is_a_backend_error() -> None:
    with pytest.raises(BackendError, match="netns na-test-missing"):
        NetlinkMonitor("na-test-missing")


async def test_overflowed_socket_resyncs_from_a_fresh_dump(
    monitor: NetlinkMonitor, netns: str, tmp_path: Path
) -> None:
    # The loop is kept busy (blocking calls, no await) while thousands of links come and go,
    # so the kernel drops notifications (ENOBUFS) and the monitor must dump again.
    pairs, deleted = 1000, range(0, 100, 2)

    def expected(i: int) -> LinkState:
        return LinkState.ABSENT if i in deleted else LinkState.DOWN

    batch = tmp_path / "batch"
    with structlog.testing.capture_logs() as logs:
        batch.write_text("".join(f"link add d{i} type veth peer name e{i}\n" for i in range(pairs)))
        _ip("-n", netns, "-batch", str(batch))
        batch.write_text("".join(f"link del d{i}\n" for i in deleted))
        _ip("-n", netns, "-batch", str(batch))
        await async_wait_until(
            lambda: all(
                monitor.state(f"d{i}") is expected(i) and monitor.state(f"e{i}") is expected(i)
                for i in range(pairs)
            ),
            what="cache matches the kernel after the overflow",
        )
    assert monitor.state("va") is LinkState.UP
    assert any(entry["event"] == "netlink_overflow_resync" for entry in logs)


def test_monitor_moves_to_the_loop_that_waits_on_it(netns: str) -> None:
    async def build() -> NetlinkMonitor:
        return NetlinkMonitor(netns)

    async def follow(mon: NetlinkMonitor) -> None:
        await _settle(mon)
        await _change_and_wait(mon, netns, ["link", "set", "vb", "down"], "va", LinkState.DOWN)

    mon = asyncio.run(build())  # that loop is gone when the monitor is used
    try:
        asyncio.run(follow(mon))
    finally:
        mon.close()
