"""parse_frame on crafted frames: what a switch sends becomes a Neighbour, and every kind of
malformed frame is refused with an error that names the fault."""

from __future__ import annotations

import pytest

from agents.hw.lldp import LldpError, Neighbour, parse_frame, sanitised
from tests.lldp_frames import (
    chassis,
    ethernet,
    frame,
    lldpdu,
    port,
    raw_tlv,
    tlv,
    ttl,
)

MAC = bytes.fromhex("0c42a1000001")
MANDATORY = chassis(MAC) + port(b"Ethernet1/1") + ttl(120)


def _neighbour(**fields: object) -> Neighbour:
    base: dict[str, object] = {
        "chassis_id": "0c:42:a1:00:00:01",
        "port_id": "Ethernet1/1",
        "ttl_s": 120,
        "system_name": "leaf-a",
    }
    base.update(fields)
    return Neighbour(**base)  # type: ignore[arg-type]


VALID = [
    ("switch", frame(), _neighbour()),
    (
        "names",
        frame(system_name="leaf-7.dc1", port_description="to gpu-12 nic 3"),
        _neighbour(system_name="leaf-7.dc1", port_description="to gpu-12 nic 3"),
    ),
    ("no-names", frame(system_name=None), _neighbour(system_name="")),
    ("vlan-tag", ethernet(lldpdu(), vlan=100), _neighbour()),
    ("shutdown", frame(ttl_s=0, system_name=None), _neighbour(ttl_s=0, system_name="")),
    ("ttl-max", frame(ttl_s=65535), _neighbour(ttl_s=65535)),
    ("no-end-tlv", ethernet(MANDATORY)[: 14 + len(MANDATORY)], _neighbour(system_name="")),
    ("padding-after-end", frame() + b"\xff" * 20, _neighbour()),
    (
        "unknown-and-org-tlvs-skipped",
        frame(extra=tlv(9, b"xyz") + tlv(127, bytes.fromhex("0080c20101")) + tlv(6, b"desc")),
        _neighbour(),
    ),
    (
        "first-system-name-counts",
        ethernet(MANDATORY + tlv(5, b"leaf-a") + tlv(5, b"leaf-b") + tlv(0)),
        _neighbour(),
    ),
    ("long-name-kept-whole", frame(system_name="l" * 200), _neighbour(system_name="l" * 200)),
    (
        "name-sanitised",
        frame(system_name="leaf\x1b[31m-a\n", port_description=" pad \x00\x00"),
        _neighbour(system_name="leaf\ufffd[31m-a", port_description="pad"),
    ),
    (
        "name-bad-utf8",
        frame(system_name=None, extra=tlv(5, b"l\xffa")),
        _neighbour(system_name="l\ufffda"),
    ),
]


@pytest.mark.parametrize(("raw", "expected"), [c[1:] for c in VALID], ids=[c[0] for c in VALID])
def test_a_well_formed_frame_names_its_neighbour(raw: bytes, expected: Neighbour) -> None:
    assert parse_frame(raw) == expected


def _ids(chassis_value: bytes, port_value: bytes) -> Neighbour:
    return parse_frame(ethernet(tlv(1, chassis_value) + tlv(2, port_value) + ttl(5) + tlv(0)))


IDS = [
    ("chassis-mac", b"\x04" + MAC, "0c:42:a1:00:00:01"),
    ("chassis-mac-short-is-hex", b"\x04\x0c\x42", "0c42"),
    ("chassis-ipv4", b"\x05\x01\x0a\x00\x00\x01", "10.0.0.1"),
    ("chassis-ipv6", b"\x05\x02" + bytes.fromhex("fd00" + "00" * 13 + "01"), "fd00::1"),
    ("chassis-ipv4-wrong-length-is-hex", b"\x05\x01\x0a\x00", "010a00"),
    ("chassis-unknown-family-is-hex", b"\x05\x09\x01\x02", "090102"),
    ("chassis-interface-name", b"\x06swp1", "swp1"),
    ("chassis-locally-assigned", b"\x07rack4-leaf2", "rack4-leaf2"),
    ("chassis-component", b"\x01chassis 1", "chassis 1"),
    ("chassis-trailing-nul", b"\x07leaf\x00", "leaf"),
    ("chassis-control-char-is-hex", b"\x07a\x07b", "610762"),
    ("chassis-not-utf8-is-hex", b"\x07\xff\xfe", "fffe"),
    ("chassis-reserved-subtype-is-hex", b"\x00abc", "616263"),
    ("chassis-subtype-8-is-hex", b"\x08\x01\x02", "0102"),
]


@pytest.mark.parametrize(("value", "shown"), [c[1:] for c in IDS], ids=[c[0] for c in IDS])
def test_a_chassis_id_is_shown_by_its_subtype(value: bytes, shown: str) -> None:
    assert _ids(value, b"\x05p1").chassis_id == shown


PORT_IDS = [
    ("port-alias", b"\x01uplink", "uplink"),
    ("port-mac", b"\x03" + MAC, "0c:42:a1:00:00:01"),
    ("port-ipv4", b"\x04\x01\xc0\xa8\x00\x01", "192.168.0.1"),
    ("port-interface-name", b"\x05Ethernet1/1", "Ethernet1/1"),
    ("port-agent-circuit-id-is-hex", b"\x06AB", "4142"),
    ("port-locally-assigned", b"\x07port 17", "port 17"),
    ("port-reserved-subtype-is-hex", b"\x0a\x01", "01"),
]


@pytest.mark.parametrize(
    ("value", "shown"), [c[1:] for c in PORT_IDS], ids=[c[0] for c in PORT_IDS]
)
def test_a_port_id_is_shown_by_its_subtype(value: bytes, shown: str) -> None:
    assert _ids(b"\x04" + MAC, value).port_id == shown


MALFORMED = [
    ("empty", b"", "shorter than an Ethernet header"),
    ("short-header", b"\x01" * 13, "shorter than an Ethernet header"),
    ("ipv4", ethernet(MANDATORY, ethertype=0x0800), "ethertype 0x0800 is not LLDP"),
    ("vlan-cut", frame()[:12] + b"\x81\x00\x00", "ends inside its header"),
    ("vlan-then-ipv4", ethernet(MANDATORY, ethertype=0x0800, vlan=5), "ethertype 0x0800"),
    ("no-tlvs", ethernet(b"")[:14], "ends after 0 TLVs, before its Chassis ID"),
    ("only-padding", ethernet(b""), "ends after 0 TLVs, before its Chassis ID"),
    ("half-tlv-header", ethernet(MANDATORY)[: 14 + len(MANDATORY)] + b"\x00", "cut off"),
    (
        "length-past-frame",
        ethernet(MANDATORY)[: 14 + len(MANDATORY)] + raw_tlv(5, 40, b"leaf"),
        "System Name TLV at byte 41 claims 40 bytes, 4 remain",
    ),
    (
        "length-511-past-frame",
        ethernet(raw_tlv(1, 511, b"\x04" + MAC)),
        "Chassis ID TLV at byte 14 claims 511 bytes",
    ),
    ("port-first", ethernet(port(b"p") + chassis(MAC) + ttl(1)), "TLV 1 (byte 14) is Port ID"),
    ("ttl-before-port", ethernet(chassis(MAC) + ttl(1) + port(b"p")), "is TTL, expected Port ID"),
    (
        "name-before-ttl",
        ethernet(chassis(MAC) + port(b"p") + tlv(5, b"x") + ttl(1)),
        "TLV 3 (byte 27) is System Name, expected TTL",
    ),
    ("no-ttl", ethernet(chassis(MAC) + port(b"p") + tlv(0)), "ends after 2 TLVs, before its TTL"),
    ("second-chassis", ethernet(MANDATORY + chassis(MAC)), "a second Chassis ID TLV"),
    ("second-ttl", ethernet(MANDATORY + ttl(9)), "a second TTL TLV"),
    ("end-with-length", ethernet(MANDATORY + raw_tlv(0, 2, b"\0\0")), "End TLV at byte"),
    ("ttl-three-bytes", ethernet(chassis(MAC) + port(b"p") + tlv(3, b"\0\0\1")), "TTL TLV of 3"),
    ("ttl-one-byte", ethernet(chassis(MAC) + port(b"p") + tlv(3, b"\1")), "TTL TLV of 1 bytes"),
    ("chassis-no-value", ethernet(tlv(1, b"\x04") + port(b"p") + ttl(1)), "Chassis ID TLV of 1"),
    ("chassis-empty", ethernet(tlv(1) + port(b"p") + ttl(1)), "Chassis ID TLV of 0 bytes"),
    (
        "chassis-too-long",
        ethernet(tlv(1, b"\x07" + b"c" * 300) + port(b"p") + ttl(1)),
        "Chassis ID TLV of 301 bytes",
    ),
    ("port-empty", ethernet(chassis(MAC) + tlv(2) + ttl(1)), "Port ID TLV of 0 bytes"),
    ("name-too-long", ethernet(MANDATORY + tlv(5, b"n" * 256)), "System Name TLV of 256 bytes"),
    ("too-many-tlvs", ethernet(MANDATORY + tlv(9) * 600), "more than 512 TLVs"),
    ("too-big", ethernet(MANDATORY + tlv(9, b"x" * 500) * 20), "over the 9216-byte limit"),
]


@pytest.mark.parametrize(
    ("raw", "reason"), [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED]
)
def test_a_malformed_frame_is_refused_with_its_fault(raw: bytes, reason: str) -> None:
    with pytest.raises(LldpError) as caught:
        parse_frame(raw)
    assert reason in str(caught.value)


SANITISED = [
    ("plain", b"leaf-a", "leaf-a"),
    ("utf8", "Brücke 3".encode(), "Brücke 3"),
    ("nul-terminated", b"leaf\0\0", "leaf"),
    ("tab-and-newline", b"a\tb\n", "a\ufffdb"),
    ("escape", b"\x1b]0;x\x07", "\ufffd]0;x\ufffd"),
    ("spaces", b"  leaf  ", "leaf"),
    ("invalid-utf8", b"\xc3", "\ufffd"),
]


@pytest.mark.parametrize(
    ("raw", "shown"), [c[1:] for c in SANITISED], ids=[c[0] for c in SANITISED]
)
def test_a_name_is_sanitised_for_logs_and_labels(raw: bytes, shown: str) -> None:
    assert sanitised(raw) == shown
