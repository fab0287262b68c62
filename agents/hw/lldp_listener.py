"""LLDP neighbours heard on the host's own netdevs (agents.hw.lldp.NeighbourSource): one raw
socket per watched netdev, read by the event loop, each neighbour kept for its TTL."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import structlog

from agents.hw.lldp import LldpError, Neighbour, parse_frame
from agents.hw.lldp_socket import RECV_SIZE, LldpSocket, open_lldp_socket

log = structlog.get_logger(__name__)

RETRY_S = 5.0  # how often netdevs without a socket are looked for, and bound ones checked
MALFORMED_LOG_S = 60.0  # at most one lldp_frame_malformed line per netdev in this time
_RECVS_PER_WAKEUP = 32  # then yield to the loop; the reader fires again while data waits
# Frames read per netdev and second, at most (a burst of as many): a switch sends one every
# 30 s, lldpd at most one a second. Past it the socket is left unread and the kernel drops
# what its buffer cannot hold: a flood of frames costs the loop about 1 % (55 us a frame),
# never the RPCs' time.
FRAMES_PER_S = 200.0
_GONE = (errno.ENXIO, errno.ENODEV, errno.ENETDOWN)

Opener = Callable[[str], LldpSocket]


@dataclass
class _Netdev:
    """One watched netdev: its socket while bound, what it last heard, its bad frames."""

    sock: LldpSocket | None = None
    heard: Neighbour | None = None
    expires: float = 0.0
    malformed: int = 0
    absent: bool = False  # its absence has been logged
    next_log: float = field(default=float("-inf"))
    tokens: float = FRAMES_PER_S  # frames it may still read now
    filled: float = field(default=float("-inf"))  # when `tokens` was last topped up
    resume: asyncio.TimerHandle | None = None  # while its reading is paused
    next_throttle_log: float = field(default=float("-inf"))


class LldpListener:
    """Implements agents.hw.lldp.NeighbourSource over AF_PACKET sockets (CAP_NET_RAW).

    Built outside a loop, it reads from the loop of the first next_change(). A netdev that
    vanishes loses its neighbour and socket and is bound again when it is back (on watch()
    or the next retry). Without CAP_NET_RAW it logs lldp_unavailable once and hears nothing.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        opener: Opener = open_lldp_socket,
        retry_s: float = RETRY_S,
        pace: Callable[[], float] = time.monotonic,
        frames_per_s: float = FRAMES_PER_S,
    ) -> None:
        self._clock, self._open, self._retry_s = clock, opener, retry_s
        self._pace, self._rate = pace, frames_per_s  # the read budget's clock and rate
        self._netdevs: dict[str, _Netdev] = {}
        self._buffer = bytearray(RECV_SIZE)
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._next_retry = float("-inf")
        self._unavailable = False
        self._closed = False

    def watch(self, ifnames: Iterable[str]) -> None:
        wanted = set(ifnames)
        for ifname in set(self._netdevs) - wanted:
            self._forget(self._netdevs.pop(ifname))
        for ifname in wanted:
            netdev = self._netdevs.setdefault(ifname, _Netdev())
            if netdev.sock is None:
                self._bind(ifname, netdev)
        with contextlib.suppress(RuntimeError):
            if self._loop is not asyncio.get_running_loop():
                self._attach(asyncio.get_running_loop())
        self._arm()

    def neighbour(self, ifname: str) -> Neighbour | None:
        netdev = self._netdevs.get(ifname)
        if netdev is None or netdev.expires <= self._clock():
            return None
        return netdev.heard

    def malformed(self, ifname: str) -> int:
        """How many frames heard on `ifname` were refused since it was watched."""
        netdev = self._netdevs.get(ifname)
        return 0 if netdev is None else netdev.malformed

    async def next_change(self, timeout_s: float) -> bool:
        if self._closed:
            await asyncio.sleep(max(timeout_s, 0.0))
            return False
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._attach(loop)
        self._tick()
        if not self._changed.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):  # a timer, not a task per wait
                    await self._changed.wait()
            self._tick()
        changed = self._changed.is_set()
        self._changed.clear()
        return changed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for netdev in self._netdevs.values():
            self._forget(netdev)
        self._netdevs.clear()
        if self._timer is not None:
            self._timer.cancel()
        self._changed.set()  # wake a waiter

    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read on `loop` from now on; an Event binds to the loop that first waits on it."""
        for netdev in self._netdevs.values():
            self._unread(netdev)
        was_set, self._changed = self._changed.is_set(), asyncio.Event()
        if was_set:
            self._changed.set()
        self._loop = loop
        for ifname, netdev in self._netdevs.items():
            if netdev.sock is not None:  # a paused one (its timer on the old loop) resumes
                loop.add_reader(netdev.sock.fileno(), self._on_readable, ifname)
                self._on_readable(ifname)  # what arrived before this loop listened

    def _bind(self, ifname: str, netdev: _Netdev) -> None:
        if self._unavailable or self._closed:
            return
        try:
            netdev.sock = self._open(ifname)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if isinstance(exc, PermissionError) or exc.errno == errno.EAFNOSUPPORT:
                self._unavailable = True
                log.warning("lldp_unavailable", reason=f"{reason} (needs CAP_NET_RAW)")
            elif not netdev.absent:
                netdev.absent = True
                log.info("lldp_netdev_absent", netdev=ifname, reason=reason)
            return
        netdev.absent = False
        if self._loop is not None and not self._loop.is_closed():
            self._loop.add_reader(netdev.sock.fileno(), self._on_readable, ifname)

    def _forget(self, netdev: _Netdev) -> None:
        """Close the netdev's socket and drop its neighbour; a change if one was known."""
        self._drop_socket(netdev)
        if netdev.heard is not None and netdev.expires > self._clock():
            self._changed.set()
        netdev.heard = None

    def _drop_socket(self, netdev: _Netdev) -> None:
        if netdev.sock is not None:
            self._unread(netdev)
            netdev.sock.close()
            netdev.sock = None

    def _unread(self, netdev: _Netdev) -> None:
        if netdev.resume is not None:
            netdev.resume.cancel()
            netdev.resume = None
        if netdev.sock is not None and self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(netdev.sock.fileno())

    def _on_readable(self, ifname: str) -> None:
        netdev = self._netdevs.get(ifname)
        for _ in range(_RECVS_PER_WAKEUP):
            if netdev is None or netdev.sock is None or netdev.resume is not None:
                return
            if not self._budget(netdev):
                self._pause(ifname, netdev)
                break
            try:
                size = netdev.sock.receive(self._buffer)
            except BlockingIOError:
                break
            except OSError as exc:
                self._failed(ifname, netdev, exc)
                break
            if size is not None:
                netdev.tokens -= 1
                self._heard(ifname, netdev, size)
        self._arm()

    def _budget(self, netdev: _Netdev) -> bool:
        """Top the netdev's frame budget up for the time passed; True if a frame is left."""
        now = self._pace()
        elapsed = max(0.0, now - netdev.filled)
        netdev.tokens = min(self._rate, netdev.tokens + elapsed * self._rate)
        netdev.filled = now
        return netdev.tokens >= 1

    def _pause(self, ifname: str, netdev: _Netdev) -> None:
        """Leave the socket unread until a frame's budget is back (the kernel drops the
        rest), saying so at most once a minute."""
        assert self._loop is not None
        self._unread(netdev)
        wait = (1 - netdev.tokens) / self._rate
        netdev.resume = self._loop.call_later(wait, self._resume, ifname)
        now = self._pace()
        if now >= netdev.next_throttle_log:
            netdev.next_throttle_log = now + MALFORMED_LOG_S
            log.warning(
                "lldp_frames_throttled",
                netdev=ifname,
                frames_per_s=self._rate,
                effect="frames past the budget are dropped by the kernel",
            )

    def _resume(self, ifname: str) -> None:
        netdev = self._netdevs.get(ifname)
        if netdev is None or netdev.resume is None:
            return
        netdev.resume = None
        if netdev.sock is not None and self._loop is not None and not self._closed:
            self._loop.add_reader(netdev.sock.fileno(), self._on_readable, ifname)
            self._on_readable(ifname)

    def _failed(self, ifname: str, netdev: _Netdev, exc: OSError) -> None:
        """A netdev that went down keeps its neighbour (the kernel hooks the socket in again
        when it comes up); one that is gone or renamed loses both, and is bound anew."""
        assert netdev.sock is not None
        if exc.errno not in _GONE:
            log.warning("lldp_receive_failed", netdev=ifname, reason=str(exc))
            self._drop_socket(netdev)
        elif netdev.sock.still_bound():
            return
        else:
            log.info("lldp_netdev_gone", netdev=ifname, reason=exc.strerror or str(exc))
            self._forget(netdev)
        self._bind(ifname, netdev)

    def _heard(self, ifname: str, netdev: _Netdev, size: int) -> None:
        now = self._clock()
        try:
            if size > len(self._buffer):
                raise LldpError(f"frame of {size} bytes is over the {len(self._buffer)}-byte limit")
            found = parse_frame(bytes(memoryview(self._buffer)[:size]))
        except LldpError as exc:
            self._refused(ifname, netdev, str(exc), now)
            return
        known = netdev.heard if netdev.expires > now else None
        if found.ttl_s == 0:  # the neighbour says it is going away
            netdev.heard, netdev.expires = None, 0.0
        else:
            netdev.heard, netdev.expires = found, now + found.ttl_s
        if netdev.heard != known:
            self._changed.set()

    def _refused(self, ifname: str, netdev: _Netdev, reason: str, now: float) -> None:
        netdev.malformed += 1
        if now >= netdev.next_log:
            netdev.next_log = now + MALFORMED_LOG_S
            log.warning(
                "lldp_frame_malformed", netdev=ifname, count=netdev.malformed, reason=reason
            )

    def _tick(self) -> None:
        """Expire neighbours whose TTL ran out; every retry_s, bind the netdevs that have no
        socket and check that bound ones are still there under their name."""
        if self._closed:
            return
        now = self._clock()
        for netdev in self._netdevs.values():
            if netdev.heard is not None and netdev.expires <= now:
                netdev.heard = None
                self._changed.set()
        if now >= self._next_retry:
            self._next_retry = now + self._retry_s
            for ifname, netdev in self._netdevs.items():
                if netdev.sock is not None and not netdev.sock.still_bound():
                    log.info("lldp_netdev_gone", netdev=ifname, reason="renamed or removed")
                    self._forget(netdev)
                if netdev.sock is None:
                    self._bind(ifname, netdev)
        self._arm()

    def _arm(self) -> None:
        """One loop timer, at the nearest expiry or retry."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._loop is None or self._loop.is_closed() or self._closed or not self._netdevs:
            return
        due = [n.expires for n in self._netdevs.values() if n.heard is not None]
        due.append(self._next_retry)
        delay = max(0.0, min(due) - self._clock())
        self._timer = self._loop.call_later(delay, self._tick)
