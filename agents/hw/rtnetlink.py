"""The rtnetlink wire format of link messages: the dump request and what comes back.

Only what link state needs is decoded (index, flags, name, operstate), straight from
the kernel's structs in <linux/netlink.h>, <linux/rtnetlink.h> and <linux/if_link.h>.
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass

NLMSG_ERROR, NLMSG_DONE = 2, 3
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
IFLA_IFNAME, IFLA_OPERSTATE = 3, 16
# IF_OPER_* of <linux/if.h> (RFC 2863), by value
OPERSTATES = ("UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP")

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_ATTR = struct.Struct("=HH")  # rtattr: length, type
_ERROR = struct.Struct("=i")  # nlmsgerr.error: 0 (an ack) or a negative errno
_ATTR_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED and NLA_F_NET_BYTEORDER


@dataclass(frozen=True)
class Message:
    """One netlink message; the link fields are set for RTM_NEWLINK and RTM_DELLINK."""

    kind: int  # nlmsg_type
    seq: int
    port: int  # the sender's port id, ours for answers to our requests
    error: int = 0  # NLMSG_ERROR and NLMSG_DONE: a negative errno, or 0
    family: int = socket.AF_UNSPEC
    index: int = 0
    flags: int = 0  # IFF_*
    ifname: str | None = None
    operstate: str | None = None


def link_dump_request(seq: int) -> bytes:
    """RTM_GETLINK for every link (NLM_F_DUMP), answered by RTM_NEWLINKs then NLMSG_DONE."""
    body = _IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
    header = _HEADER.pack(_HEADER.size + len(body), RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, seq, 0)
    return header + body


def parse(data: bytes) -> Iterator[Message]:
    """The messages of one datagram. OSError(EBADMSG) for one cut short."""
    view = memoryview(data)
    offset = 0
    while len(data) - offset >= _HEADER.size:
        length, kind, _flags, seq, port = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size or offset + length > len(data):
            raise OSError(errno.EBADMSG, f"netlink message of {length} bytes cut short")
        body = view[offset + _HEADER.size : offset + length]
        offset += _aligned(length)
        if kind in (RTM_NEWLINK, RTM_DELLINK):
            yield _link(kind, seq, port, body)
        elif kind in (NLMSG_ERROR, NLMSG_DONE) and len(body) >= _ERROR.size:
            yield Message(kind, seq, port, error=_ERROR.unpack_from(body)[0])
        else:
            yield Message(kind, seq, port)


def _link(kind: int, seq: int, port: int, body: memoryview) -> Message:
    if len(body) < _IFINFO.size:
        raise OSError(errno.EBADMSG, "link message without its ifinfomsg")
    family, _type, index, flags, _change = _IFINFO.unpack_from(body)
    ifname = operstate = None
    offset = _IFINFO.size
    while len(body) - offset >= _ATTR.size:
        length, attr = _ATTR.unpack_from(body, offset)
        if length < _ATTR.size:
            break  # malformed: nothing further can be trusted
        value = body[offset + _ATTR.size : offset + length]
        attr &= _ATTR_TYPE_MASK
        if attr == IFLA_IFNAME:
            ifname = bytes(value).split(b"\0", 1)[0].decode(errors="replace")
        elif attr == IFLA_OPERSTATE and len(value) >= 1:
            operstate = OPERSTATES[value[0]] if value[0] < len(OPERSTATES) else "UNKNOWN"
        offset += _aligned(length)
    return Message(kind, seq, port, 0, family, index, flags, ifname, operstate)


def _aligned(length: int) -> int:
    return (length + 3) & ~3  # NLMSG_ALIGN and RTA_ALIGN: 4 bytes
