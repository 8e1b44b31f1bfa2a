"""RTP fixed header parse/build (RFC 3550 §5.1) and every malformed case."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.media.errors import LocalMediaError, RtpError
from gateway.media.rtp import (
    RTP_ERROR_REASONS,
    build_rtp,
    looks_like_rtcp,
    pack_rtp_header,
    parse_rtp,
    seq_delta,
    ts_delta,
)


def test_build_parse_round_trip() -> None:
    data = build_rtp(
        payload_type=0, sequence_number=65535, timestamp=0xFFFFFF60, ssrc=0xDEADBEEF, payload=b"\xff" * 160, marker=True
    )
    assert len(data) == 172
    assert data[:2] == b"\x80\x80"
    p = parse_rtp(data)
    assert (p.marker, p.payload_type, p.sequence_number, p.timestamp, p.ssrc) == (
        True,
        0,
        65535,
        0xFFFFFF60,
        0xDEADBEEF,
    )
    assert p.payload == b"\xff" * 160
    assert p.csrc == () and p.extension_profile is None


def test_csrc_round_trip_and_fast_header_matches_builder() -> None:
    data = build_rtp(payload_type=8, sequence_number=7, timestamp=99, ssrc=5, payload=b"ab", csrc=(1, 2, 3))
    p = parse_rtp(data)
    assert p.csrc == (1, 2, 3) and p.payload == b"ab" and not p.marker
    assert pack_rtp_header(False, 8, 7, 99, 5) + b"ab" == build_rtp(
        payload_type=8, sequence_number=7, timestamp=99, ssrc=5, payload=b"ab"
    )


def test_extension_is_skipped_and_padding_removed() -> None:
    header = struct.pack("!BBHII", 0x80 | 0x20 | 0x10 | 1, 0x60, 10, 20, 30)
    csrc = struct.pack("!I", 42)
    ext = struct.pack("!HH", 0xBEDE, 2) + b"12345678"
    payload = b"PAYLOAD"
    padding = b"\x00\x00\x03"
    p = parse_rtp(header + csrc + ext + payload + padding)
    assert p.payload == payload
    assert p.extension_profile == 0xBEDE and p.extension_data == b"12345678"
    assert p.csrc == (42,) and p.payload_type == 0x60


def test_builder_refuses_illegal_values() -> None:
    with pytest.raises(LocalMediaError):
        build_rtp(payload_type=128, sequence_number=0, timestamp=0, ssrc=0, payload=b"")
    with pytest.raises(LocalMediaError):
        build_rtp(payload_type=0, sequence_number=0, timestamp=0, ssrc=0, payload=b"", csrc=tuple(range(16)))


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"", "short"),
        (b"\x80\x00" + b"\x00" * 9, "short"),
        (struct.pack("!BBHII", 0x40, 0, 1, 2, 3) + b"x", "version"),
        (struct.pack("!BBHII", 0xC0, 0, 1, 2, 3), "version"),
        (struct.pack("!BBHII", 0x82, 0, 1, 2, 3) + b"\x00" * 4, "csrc_count"),
        (struct.pack("!BBHII", 0x90, 0, 1, 2, 3) + b"\x00\x01", "extension_length"),
        (struct.pack("!BBHII", 0x90, 0, 1, 2, 3) + struct.pack("!HH", 1, 3) + b"\x00" * 8, "extension_length"),
        (struct.pack("!BBHII", 0xA0, 0, 1, 2, 3) + b"ab\x00", "padding"),
        (struct.pack("!BBHII", 0xA0, 0, 1, 2, 3) + b"ab\x04", "padding"),
        (struct.pack("!BBHII", 0xA0, 0, 1, 2, 3), "padding"),
        # The extension fits the datagram but runs into the padding.
        (struct.pack("!BBHII", 0xB0, 0, 1, 2, 3) + struct.pack("!HH", 1, 1) + b"\x00\x00\x00\x02", "extension_length"),
    ],
)
def test_malformed_packets_raise_with_reason(data: bytes, reason: str) -> None:
    with pytest.raises(RtpError) as info:
        parse_rtp(data)
    assert info.value.reason == reason
    assert reason in RTP_ERROR_REASONS


@given(st.binary(max_size=80))
def test_arbitrary_bytes_raise_only_rtp_error(data: bytes) -> None:
    try:
        p = parse_rtp(data)
    except RtpError as exc:
        assert exc.reason in RTP_ERROR_REASONS
    else:
        assert len(p.payload) <= len(data) - 12


@given(
    st.integers(0, 127),
    st.integers(0, 0xFFFF),
    st.integers(0, 0xFFFFFFFF),
    st.integers(0, 0xFFFFFFFF),
    st.booleans(),
    st.binary(max_size=200),
)
def test_round_trip_property(pt: int, seq: int, ts: int, ssrc: int, marker: bool, payload: bytes) -> None:
    data = build_rtp(payload_type=pt, sequence_number=seq, timestamp=ts, ssrc=ssrc, payload=payload, marker=marker)
    p = parse_rtp(data)
    assert (p.payload_type, p.sequence_number, p.timestamp, p.ssrc, p.marker, p.payload) == (
        pt,
        seq,
        ts,
        ssrc,
        marker,
        payload,
    )


def test_serial_number_arithmetic_wraps() -> None:
    assert seq_delta(0, 65535) == 1
    assert seq_delta(65535, 0) == -1
    assert seq_delta(100, 100) == 0
    assert ts_delta(80, 0xFFFFFFB0) == 160
    assert ts_delta(0xFFFFFFB0, 80) == -160


def test_rtcp_mux_demultiplexing() -> None:
    assert looks_like_rtcp(b"\x80\xc8\x00\x06")  # SR
    assert looks_like_rtcp(b"\x81\xc9\x00\x07")  # RR
    assert not looks_like_rtcp(build_rtp(payload_type=0, sequence_number=1, timestamp=1, ssrc=1, payload=b"x"))
    assert not looks_like_rtcp(build_rtp(payload_type=111, sequence_number=1, timestamp=1, ssrc=1, payload=b"x"))
