"""The link-state Protocol the RoCE family uses, and the real backend over rtnetlink."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import errno
import os
import socket
from typing import Protocol

import structlog

from agents.errors import BackendError
from agents.hw import rtnetlink

log = structlog.get_logger(__name__)


class LinkState(enum.Enum):
    UP = "up"
    DOWN = "down"  # admin down or no carrier
    ABSENT = "absent"  # no such interface


class LinkMonitor(Protocol):
    """Link state of network interfaces, with changes pushed by the kernel."""

    def state(self, ifname: str) -> LinkState: ...

    async def next_change(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for a link change; True if one (may have) happened."""
        ...

    def close(self) -> None: ...


# from <linux/rtnetlink.h> and <linux/if.h>
_RTMGRP_LINK = 0x1
IFF_UP, IFF_RUNNING, IFF_LOWER_UP = 0x1, 0x40, 0x10000

_RCVBUF = 1 << 20
_RECV_SIZE = 1 << 16
_RECVS_PER_WAKEUP = 64  # then yield to the loop; the reader fires again while data waits
_DUMP_TIMEOUT_S = 5.0


def link_state(flags: int, operstate: str) -> LinkState:
    """UP when administratively up and the carrier is up; DOWN otherwise.

    Drivers that do not track operstate report UNKNOWN; then the lower-layer flags decide.
    """
    if not flags & IFF_UP:
        return LinkState.DOWN
    if operstate == "UP":
        return LinkState.UP
    if operstate == "UNKNOWN" and flags & (IFF_RUNNING | IFF_LOWER_UP):
        return LinkState.UP
    return LinkState.DOWN


class NetlinkMonitor:
    """LinkMonitor over an rtnetlink socket subscribed to link changes.

    One socket carries an initial dump and then the kernel's link notifications; the asyncio
    loop reads it when readable (no thread, no polling) and keeps a cache that state()
    answers from. Built outside a loop, it attaches to the loop of the first next_change().
    A receive-buffer overflow triggers a fresh dump, so no change is lost for good.
    """

    def __init__(self, netns: str | None = None) -> None:
        self._sock = _open_socket(netns)
        self._port: int = self._sock.getsockname()[0]
        self._links: dict[int, tuple[str, LinkState]] = {}
        self._index_by_name: dict[str, int] = {}
        self._seq = 0
        self._dump_seq: int | None = None
        self._dump_seen: set[int] = set()
        self._dump_answering = False  # the current dump's first answer has arrived
        self._resync_wanted = False
        self._changed = asyncio.Event()
        self._error: BackendError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        try:
            self._initial_dump()
        except OSError as exc:
            self._sock.close()
            raise BackendError(f"netlink link dump failed: {exc}") from exc
        self._changed.clear()
        with contextlib.suppress(RuntimeError):
            self._attach(asyncio.get_running_loop())

    def state(self, ifname: str) -> LinkState:
        index = self._index_by_name.get(ifname)
        return LinkState.ABSENT if index is None else self._links[index][1]

    async def next_change(self, timeout_s: float) -> bool:
        if self._closed:
            raise BackendError("netlink monitor is closed")
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._attach(loop)
            self._on_readable()  # what arrived before this loop listened
        if self._error is None:
            try:
                async with asyncio.timeout(timeout_s):  # a timer, not a task per wait
                    await self._changed.wait()
            except TimeoutError:
                return False
        if self._error is not None:
            raise self._error
        self._changed.clear()
        return True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._detach()
        self._sock.close()
        self._changed.set()  # wake a waiter

    def _attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self._detach()
        if self._loop is not None:  # an Event binds to the loop that first waits on it
            was_set, self._changed = self._changed.is_set(), asyncio.Event()
            if was_set:
                self._changed.set()
        self._loop = loop
        loop.add_reader(self._sock.fileno(), self._on_readable)

    def _detach(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._sock.fileno())

    def _initial_dump(self) -> None:
        self._sock.settimeout(_DUMP_TIMEOUT_S)
        self._request_dump()
        while self._dump_seq is not None:
            self._receive(self._sock.recv(_RECV_SIZE))
        self._sock.setblocking(False)

    def _on_readable(self) -> None:
        try:
            for _ in range(_RECVS_PER_WAKEUP):
                self._receive(self._sock.recv(_RECV_SIZE))
        except BlockingIOError:
            return
        except OSError as exc:
            if exc.errno != errno.ENOBUFS:
                self._fail(exc)
                return
            log.warning("netlink_overflow_resync")
            if self._dump_seq is None:
                self._request_dump()
            else:
                self._resync_wanted = True

    def _fail(self, exc: OSError) -> None:
        self._error = BackendError(f"netlink link monitor failed: {exc}")
        self._detach()
        self._changed.set()

    def _request_dump(self) -> None:
        self._seq += 1
        self._dump_seq = self._seq
        self._dump_seen = set()
        self._dump_answering = False
        self._sock.send(rtnetlink.link_dump_request(self._seq))

    def _receive(self, data: bytes) -> None:
        for msg in rtnetlink.parse(data):
            self._handle(msg)

    def _handle(self, msg: rtnetlink.Message) -> None:
        kind = msg.kind
        answer = self._dump_seq is not None and msg.port == self._port
        answer = answer and msg.seq == self._dump_seq
        if answer and kind in (rtnetlink.NLMSG_DONE, rtnetlink.NLMSG_ERROR):
            if msg.error:
                raise OSError(f"link dump refused: {os.strerror(-msg.error)}")
            self._finish_dump()
        elif kind not in (rtnetlink.RTM_NEWLINK, rtnetlink.RTM_DELLINK):
            return
        elif msg.family != socket.AF_UNSPEC:
            return  # bridge-port notifications share the group, with family AF_BRIDGE
        elif kind == rtnetlink.RTM_DELLINK:
            self._dump_seen.discard(msg.index)
            self._remove(msg.index)
        else:
            # The socket queue is in time order: notifications queued before the dump's
            # first answer are older than the dump and cannot vouch that a link exists.
            self._dump_answering |= answer
            if self._dump_answering:
                self._dump_seen.add(msg.index)
            state = link_state(msg.flags, msg.operstate or "UNKNOWN")
            self._set(msg.index, msg.ifname, state)

    def _finish_dump(self) -> None:
        """Links not heard of during the dump are gone (their removal may have been lost)."""
        for index in set(self._links) - self._dump_seen:
            self._remove(index)
        self._dump_seq = None
        if self._resync_wanted:
            self._resync_wanted = False
            self._request_dump()

    def _set(self, index: int, name: str | None, state: LinkState) -> None:
        old = self._links.get(index)
        name = name or (old[0] if old else None)
        if name is None or old == (name, state):
            return
        if old is not None and self._index_by_name.get(old[0]) == index:
            del self._index_by_name[old[0]]  # renamed
        stale = self._index_by_name.get(name)
        if stale is not None and stale != index:
            del self._links[stale]  # its removal was lost in an overflow
        self._links[index] = (name, state)
        self._index_by_name[name] = index
        self._changed.set()

    def _remove(self, index: int) -> None:
        old = self._links.pop(index, None)
        if old is None:
            return
        if self._index_by_name.get(old[0]) == index:
            del self._index_by_name[old[0]]
        self._changed.set()


def _open_socket(netns: str | None) -> socket.socket:
    where = f" in netns {netns}" if netns else ""
    try:
        if netns is None:
            return _link_socket()
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(_link_socket_in, netns).result()
    except OSError as exc:
        raise BackendError(f"netlink socket{where}: {exc}") from exc


def _link_socket_in(netns: str) -> socket.socket:
    # Imported here: pyroute2 costs a tenth of a second to import, and only tests and
    # tools ask for a namespace other than our own.
    from pyroute2 import netns as pyroute2_netns

    # setns() moves only the calling thread, a throwaway one; the socket stays in netns.
    pyroute2_netns.setns(netns, flags=0)  # flags=0: never create the namespace
    return _link_socket()


def _link_socket() -> socket.socket:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _RCVBUF)
        sock.bind((0, _RTMGRP_LINK))
    except OSError:
        sock.close()
        raise
    return sock
