"""LLDP frames built byte by byte for the tests, and a sender that puts them on the wire
from the far end of a veth, inside that end's network namespace."""

from __future__ import annotations

import concurrent.futures
import socket
import struct
from typing import Any

from agents.hw.lldp import ETHERTYPE_LLDP, NEAREST_BRIDGE

SOURCE = bytes.fromhex("02000000aa01")  # a locally administered MAC for the "switch"
MAC = 4  # chassis ID subtype: MAC address
INTERFACE_NAME = 5  # port ID subtype: interface name


def tlv(kind: int, value: bytes = b"") -> bytes:
    """One TLV; a `length` that lies is made with raw_tlv."""
    return raw_tlv(kind, len(value), value)


def raw_tlv(kind: int, length: int, value: bytes = b"") -> bytes:
    return struct.pack("!H", (kind << 9) | length) + value


def chassis(value: bytes, subtype: int = MAC) -> bytes:
    return tlv(1, bytes([subtype]) + value)


def port(value: bytes, subtype: int = INTERFACE_NAME) -> bytes:
    return tlv(2, bytes([subtype]) + value)


def ttl(seconds: int) -> bytes:
    return tlv(3, struct.pack("!H", seconds))


def ethernet(payload: bytes, *, ethertype: int = ETHERTYPE_LLDP, vlan: int | None = None) -> bytes:
    """The payload behind an Ethernet header to the nearest bridge, padded to 60 bytes as a
    NIC pads it."""
    header = NEAREST_BRIDGE + SOURCE
    if vlan is not None:
        header += struct.pack("!HH", 0x8100, vlan)
    raw = header + struct.pack("!H", ethertype) + payload
    return raw + b"\0" * max(0, 60 - len(raw))


def lldpdu(
    *,
    chassis_mac: bytes = bytes.fromhex("0c42a1000001"),
    port_name: str = "Ethernet1/1",
    ttl_s: int = 120,
    system_name: str | None = "leaf-a",
    port_description: str | None = None,
    extra: bytes = b"",
) -> bytes:
    """The TLVs a switch sends: the mandatory three, the names asked for, `extra`, End."""
    body = chassis(chassis_mac) + port(port_name.encode()) + ttl(ttl_s)
    if port_description is not None:
        body += tlv(4, port_description.encode())
    if system_name is not None:
        body += tlv(5, system_name.encode())
    return body + extra + tlv(0)


def frame(**fields: Any) -> bytes:
    """A whole Ethernet frame carrying lldpdu(**fields)."""
    return ethernet(lldpdu(**fields))


class PeerSender:
    """An AF_PACKET socket on `ifname` in network namespace `netns` that sends whole frames.

    The socket is made in a throwaway thread that enters the namespace (setns moves only the
    calling thread); once made, it stays in that namespace whichever thread uses it.
    """

    def __init__(self, netns: str, ifname: str) -> None:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            self._sock = pool.submit(_packet_socket_in, netns, ifname).result()

    def send(self, raw: bytes) -> None:
        self._sock.send(raw)

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> PeerSender:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _packet_socket_in(netns: str, ifname: str) -> socket.socket:
    from pyroute2 import netns as pyroute2_netns

    pyroute2_netns.setns(netns, flags=0)
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    sock.bind((ifname, 0))
    return sock
