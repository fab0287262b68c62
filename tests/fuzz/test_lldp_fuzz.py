"""parse_frame on hostile bytes: random frames, random TLV chains and mutated real frames
either parse to a bounded Neighbour or raise LldpError, never anything else."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.hw.lldp import MAX_TEXT_BYTES, LldpError, Neighbour, parse_frame
from tests.fuzz.fuzzing import FUZZ
from tests.lldp_frames import ethernet, frame, raw_tlv

pytestmark = pytest.mark.fuzz

SEEDS = [
    frame(),
    frame(system_name="leaf-7", port_description="uplink to spine", ttl_s=0),
    frame(system_name=None, extra=raw_tlv(127, 6, bytes.fromhex("0080c2010001"))),
]


def _parses_or_refuses(raw: bytes) -> Neighbour | None:
    try:
        found = parse_frame(raw)
    except LldpError as exc:
        assert str(exc), "an LldpError names its fault"
        return None
    # whatever parses is bounded: IDs at most 255 bytes as hex, names at most 255 chars
    for text in (found.chassis_id, found.port_id, found.system_name, found.port_description):
        assert len(text) <= 2 * MAX_TEXT_BYTES
        assert text.isprintable()
    assert 0 <= found.ttl_s <= 0xFFFF
    return found


@FUZZ
@given(st.binary(max_size=2048))
def test_any_bytes_parse_or_raise_lldp_error(raw: bytes) -> None:
    _parses_or_refuses(raw)


@FUZZ
@given(st.binary(max_size=600))
def test_any_payload_behind_an_lldp_header_parses_or_raises_lldp_error(payload: bytes) -> None:
    _parses_or_refuses(ethernet(payload))


_TLV = st.tuples(st.integers(0, 127), st.integers(0, 511), st.binary(max_size=40)).map(
    lambda t: raw_tlv(*t)
)


@FUZZ
@given(st.lists(_TLV, max_size=30))
def test_any_chain_of_tlvs_with_lying_lengths_parses_or_raises_lldp_error(
    tlvs: list[bytes],
) -> None:
    _parses_or_refuses(ethernet(b"".join(tlvs)))


@st.composite
def _mutated(draw: st.DrawFn) -> bytes:
    raw = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.integers(0, len(raw) - 1))
        action = draw(st.sampled_from(["flip", "set", "cut", "insert", "delete"]))
        if action == "flip":
            raw[at] ^= 1 << draw(st.integers(0, 7))
        elif action == "set":
            raw[at] = draw(st.integers(0, 255))
        elif action == "cut":
            del raw[at:]
        elif action == "insert":
            raw[at:at] = draw(st.binary(min_size=1, max_size=8))
        else:
            del raw[at : at + draw(st.integers(1, 8))]
        if not raw:
            break
    return bytes(raw)


@FUZZ
@given(_mutated())
def test_a_mutated_switch_frame_parses_or_raises_lldp_error(raw: bytes) -> None:
    _parses_or_refuses(raw)
