"""What a NIC hears of its link partner over LLDP (IEEE 802.1AB): the neighbour a frame
names, a parser that trusts no byte of the frame, and the Protocol the RoCE family reads
neighbours through (real: agents.hw.lldp_listener; simulated: the node file's `nics[].lldp`)."""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

ETHERTYPE_LLDP = 0x88CC
ETHERTYPE_VLAN = 0x8100
NEAREST_BRIDGE = bytes.fromhex("0180c200000e")  # the destination LLDP uses towards a switch

MAX_FRAME_BYTES = 9216  # a jumbo frame; an LLDPDU rarely needs a tenth of it
MAX_TLVS = 512  # a real LLDPDU carries a few dozen
MAX_TEXT_BYTES = 255  # the standard's bound on every string TLV
TTL_MAX_S = 0xFFFF

# TLV types (802.1AB clause 8.4 and 8.5)
END, CHASSIS_ID, PORT_ID, TTL, PORT_DESCRIPTION, SYSTEM_NAME = 0, 1, 2, 3, 4, 5
_TLV_NAMES = {
    END: "End",
    CHASSIS_ID: "Chassis ID",
    PORT_ID: "Port ID",
    TTL: "TTL",
    PORT_DESCRIPTION: "Port Description",
    SYSTEM_NAME: "System Name",
}
_MANDATORY = (CHASSIS_ID, PORT_ID, TTL)

# ID subtypes whose value is text, and those holding a MAC or a network address
_CHASSIS_TEXT, _CHASSIS_MAC, _CHASSIS_NET = {1, 2, 3, 6, 7}, 4, 5
_PORT_TEXT, _PORT_MAC, _PORT_NET = {1, 2, 5, 7}, 3, 4
_IANA_IPV4, _IANA_IPV6 = 1, 2


class LldpError(ValueError):
    """A frame that is not a well-formed LLDPDU; it names what is wrong."""


@dataclass(frozen=True)
class Neighbour:
    """The switch port at the other end of a NIC's cable, as its last frame described it."""

    chassis_id: str
    port_id: str
    ttl_s: int  # how long the frame's facts hold; 0 means the neighbour is gone
    system_name: str = ""
    port_description: str = ""

    @property
    def leaf(self) -> str:
        """The leaf switch's name: its system name, else its chassis ID."""
        return self.system_name or self.chassis_id


class NeighbourSource(Protocol):
    """The LLDP neighbour of each watched netdev, kept for as long as its TTL says."""

    def watch(self, ifnames: Iterable[str]) -> None:
        """Listen on exactly these netdevs from now on (the RoCE NICs' own)."""
        ...

    def neighbour(self, ifname: str) -> Neighbour | None:
        """The neighbour heard on `ifname` whose TTL has not run out, or None."""
        ...

    async def next_change(self, timeout_s: float) -> bool:
        """Wait up to timeout_s for a neighbour to appear, change or expire; True if one did."""
        ...

    def close(self) -> None: ...


def parse_frame(frame: bytes) -> Neighbour:
    """The neighbour a whole Ethernet frame names (destination, source, at most one 802.1Q
    tag, ethertype 0x88cc, LLDPDU); LldpError, naming the fault, for anything else."""
    if len(frame) > MAX_FRAME_BYTES:
        raise LldpError(f"frame of {len(frame)} bytes is over the {MAX_FRAME_BYTES}-byte limit")
    start = 14
    if len(frame) < start:
        raise LldpError(f"frame of {len(frame)} bytes is shorter than an Ethernet header")
    ethertype = int.from_bytes(frame[12:14], "big")
    if ethertype == ETHERTYPE_VLAN:
        start = 18
        if len(frame) < start:
            raise LldpError(f"tagged frame of {len(frame)} bytes ends inside its header")
        ethertype = int.from_bytes(frame[16:18], "big")
    if ethertype != ETHERTYPE_LLDP:
        raise LldpError(f"ethertype {ethertype:#06x} is not LLDP ({ETHERTYPE_LLDP:#06x})")
    return _neighbour(_tlvs(frame, start))


def _tlvs(frame: bytes, offset: int) -> list[tuple[int, bytes]]:
    """The TLVs up to the End TLV or the frame's end (802.1AB-2009 lets End be left out),
    checked for length, count and the mandatory three first and in order."""
    found: list[tuple[int, bytes]] = []
    while offset < len(frame):
        if len(frame) - offset < 2:
            raise LldpError(f"TLV header at byte {offset} is cut off by the frame's end")
        (header,) = struct.unpack_from("!H", frame, offset)
        kind, length = header >> 9, header & 0x1FF
        value = frame[offset + 2 : offset + 2 + length]
        if len(value) < length:
            raise LldpError(
                f"{_name(kind)} TLV at byte {offset} claims {length} bytes, "
                f"{len(frame) - offset - 2} remain"
            )
        _check_place(kind, length, len(found), offset)
        if kind == END:
            break
        found.append((kind, value))
        if len(found) > MAX_TLVS:
            raise LldpError(f"more than {MAX_TLVS} TLVs")
        offset += 2 + length
    if len(found) < len(_MANDATORY):
        missing = _name(_MANDATORY[len(found)])
        raise LldpError(f"LLDPDU ends after {len(found)} TLVs, before its {missing} TLV")
    return found


def _check_place(kind: int, length: int, index: int, offset: int) -> None:
    """Chassis ID, Port ID and TTL come first, in that order, and only once."""
    if index < len(_MANDATORY) and kind != END and kind != _MANDATORY[index]:
        raise LldpError(
            f"TLV {index + 1} (byte {offset}) is {_name(kind)}, expected {_name(_MANDATORY[index])}"
        )
    if index >= len(_MANDATORY) and kind in _MANDATORY:
        raise LldpError(f"a second {_name(kind)} TLV at byte {offset}")
    if kind == END and length != 0:
        raise LldpError(f"End TLV at byte {offset} has length {length}, not 0")


def _neighbour(tlvs: list[tuple[int, bytes]]) -> Neighbour:
    (_, chassis), (_, port), (_, ttl) = tlvs[:3]
    if len(ttl) != 2:
        raise LldpError(f"TTL TLV of {len(ttl)} bytes, not 2")
    optional: dict[int, bytes] = {}
    for kind, value in tlvs[3:]:
        # The first of a TLV allowed once counts; unknown and organisation TLVs are skipped.
        if kind in (SYSTEM_NAME, PORT_DESCRIPTION) and kind not in optional:
            if len(value) > MAX_TEXT_BYTES:
                raise LldpError(f"{_name(kind)} TLV of {len(value)} bytes, over {MAX_TEXT_BYTES}")
            optional[kind] = value
    return Neighbour(
        chassis_id=_id_text(CHASSIS_ID, chassis, _CHASSIS_TEXT, _CHASSIS_MAC, _CHASSIS_NET),
        port_id=_id_text(PORT_ID, port, _PORT_TEXT, _PORT_MAC, _PORT_NET),
        ttl_s=int.from_bytes(ttl, "big"),
        system_name=sanitised(optional.get(SYSTEM_NAME, b"")),
        port_description=sanitised(optional.get(PORT_DESCRIPTION, b"")),
    )


def _id_text(kind: int, value: bytes, text: set[int], mac: int, net: int) -> str:
    """A chassis or port ID as a person reads it: text, a MAC address, an IP address;
    hex for what is none of those (a reserved subtype, an odd length, bytes not text)."""
    if not 2 <= len(value) <= 1 + MAX_TEXT_BYTES:
        raise LldpError(f"{_name(kind)} TLV of {len(value)} bytes; 2 to 256 allowed")
    subtype, body = value[0], value[1:]
    if subtype in text:
        shown = _printable(body.rstrip(b"\0"))
        if shown:
            return shown
    elif subtype == mac and len(body) == 6:
        return ":".join(f"{b:02x}" for b in body)
    elif subtype == net:
        address = _address(body)
        if address:
            return address
    return body.hex()


def _address(body: bytes) -> str:
    """An IANA address-family byte and the address; "" for a family or length we don't know."""
    family, raw = body[0], body[1:]
    if (family, len(raw)) == (_IANA_IPV4, 4):
        return str(ipaddress.IPv4Address(raw))
    if (family, len(raw)) == (_IANA_IPV6, 16):
        return str(ipaddress.IPv6Address(raw))
    return ""


def _printable(raw: bytes) -> str:
    """The bytes as text if they are UTF-8 of printable characters only, else ""."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return ""
    return text if text.isprintable() else ""


def sanitised(raw: bytes) -> str:
    """A name or description for logs and labels: UTF-8 (bad bytes replaced), trailing NULs
    and surrounding white space dropped, every other unprintable character shown as U+FFFD."""
    text = raw.rstrip(b"\0").decode("utf-8", errors="replace").strip()
    return "".join(c if c.isprintable() else "\ufffd" for c in text)


def _name(kind: int) -> str:
    if kind in _TLV_NAMES:
        return _TLV_NAMES[kind]
    return "organisation-specific" if kind == 127 else f"type-{kind}"
