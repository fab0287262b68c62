"""Decoding rtnetlink link messages: crafted bytes, and the kernel's own dump checked
against pyroute2's decoder."""

from __future__ import annotations

import errno
import socket
import struct

import pytest

from agents.hw import rtnetlink
from agents.hw.rtnetlink import Message

IFF_UP_RUNNING = 0x41
NLA_F_NESTED = 0x8000


def _attr(kind: int, value: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(value), kind) + value
    return raw + b"\0" * (-len(raw) % 4)


def _message(kind: int, body: bytes, *, seq: int = 7, port: int = 42) -> bytes:
    return struct.pack("=IHHII", 16 + len(body), kind, 0, seq, port) + body


def _link(
    kind: int = rtnetlink.RTM_NEWLINK,
    *,
    index: int = 3,
    flags: int = IFF_UP_RUNNING,
    family: int = socket.AF_UNSPEC,
    attrs: bytes = b"",
) -> bytes:
    return _message(kind, struct.pack("=BxHiII", family, 1, index, flags, 0) + attrs)


NAME_ETH0 = _attr(rtnetlink.IFLA_IFNAME, b"eth0\0")
OPER_UP = _attr(rtnetlink.IFLA_OPERSTATE, bytes([6]))

CASES = [
    (
        _link(attrs=NAME_ETH0 + OPER_UP),
        [Message(16, 7, 42, 0, 0, 3, IFF_UP_RUNNING, "eth0", "UP")],
    ),
    (
        _link(rtnetlink.RTM_DELLINK, index=9, flags=0, attrs=_attr(3, b"veth12345\0")),
        [Message(17, 7, 42, 0, 0, 9, 0, "veth12345", None)],
    ),
    (
        _link(attrs=_attr(rtnetlink.IFLA_OPERSTATE, bytes([42])) + NAME_ETH0),
        [Message(16, 7, 42, 0, 0, 3, IFF_UP_RUNNING, "eth0", "UNKNOWN")],
    ),
    (
        _link(attrs=_attr(26 | NLA_F_NESTED, _attr(1, b"xy")) + NAME_ETH0),
        [Message(16, 7, 42, 0, 0, 3, IFF_UP_RUNNING, "eth0", None)],
    ),
    (
        _link(family=socket.AF_BRIDGE, attrs=NAME_ETH0),
        [Message(16, 7, 42, 0, socket.AF_BRIDGE, 3, IFF_UP_RUNNING, "eth0", None)],
    ),
    (
        _link(index=1, attrs=_attr(3, b"a\0")) + _link(index=2, attrs=_attr(3, b"bcdef\0")),
        [
            Message(16, 7, 42, 0, 0, 1, IFF_UP_RUNNING, "a", None),
            Message(16, 7, 42, 0, 0, 2, IFF_UP_RUNNING, "bcdef", None),
        ],
    ),
    (_message(rtnetlink.NLMSG_DONE, struct.pack("=i", 0)), [Message(3, 7, 42)]),
    (
        _message(rtnetlink.NLMSG_ERROR, struct.pack("=i", -errno.EPERM) + bytes(16)),
        [Message(2, 7, 42, error=-errno.EPERM)],
    ),
    (_message(99, b"\1\2\3\4"), [Message(99, 7, 42)]),
    (b"", []),
]


@pytest.mark.parametrize(
    ("data", "want"),
    CASES,
    ids=[
        "newlink",
        "dellink",
        "unknown-operstate",
        "nested-attribute-skipped",
        "bridge-family",
        "two-in-one-datagram-padded",
        "done",
        "error",
        "other-type",
        "empty",
    ],
)
def test_parse_decodes_what_link_state_needs(data: bytes, want: list[Message]) -> None:
    assert list(rtnetlink.parse(data)) == want


@pytest.mark.parametrize(
    "data",
    [
        _link(attrs=NAME_ETH0)[:-3],
        struct.pack("=IHHII", 8, 16, 0, 1, 1),
        _message(rtnetlink.RTM_NEWLINK, b"\0" * 8),
    ],
    ids=["cut-short", "length-below-header", "no-ifinfomsg"],
)
def test_truncated_messages_are_an_os_error(data: bytes) -> None:
    with pytest.raises(OSError) as info:
        list(rtnetlink.parse(data))
    assert info.value.errno == errno.EBADMSG


def test_dump_request_is_a_getlink_dump_of_every_family() -> None:
    request = rtnetlink.link_dump_request(5)
    assert struct.unpack("=IHHII", request[:16]) == (32, rtnetlink.RTM_GETLINK, 0x301, 5, 0)
    assert request[16:] == struct.pack("=BxHiII", socket.AF_UNSPEC, 0, 0, 0, 0)


def _kernel_dump() -> list[bytes]:
    """This namespace's link dump, as the datagrams the kernel sends."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(5)
        sock.bind((0, 0))
        sock.send(rtnetlink.link_dump_request(1))
        datagrams = []
        while True:
            data = sock.recv(1 << 16)
            datagrams.append(data)
            if any(m.kind == rtnetlink.NLMSG_DONE for m in rtnetlink.parse(data)):
                return datagrams


def test_the_kernels_dump_decodes_as_pyroute2_decodes_it() -> None:
    from pyroute2.netlink.rtnl.marshal import MarshalRtnl

    marshal = MarshalRtnl()
    ours, theirs = [], []
    for data in _kernel_dump():
        ours += [m for m in rtnetlink.parse(data) if m.kind == rtnetlink.RTM_NEWLINK]
        theirs += [m for m in marshal.parse(data) if m["header"]["type"] == rtnetlink.RTM_NEWLINK]
    assert ours, "the kernel listed no links (there is always lo)"
    assert [(m.index, m.flags, m.family, m.ifname, m.operstate) for m in ours] == [
        (
            m["index"],
            m["flags"],
            m["family"],
            m.get_attr("IFLA_IFNAME"),
            m.get_attr("IFLA_OPERSTATE"),
        )
        for m in theirs
    ]
