"""RTCP SR/RR/SDES/BYE build and parse (RFC 3550 §6.4) and round-trip time from LSR/DLSR."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.media.errors import RtcpError
from gateway.media.rtcp import (
    RTCP_ERROR_REASONS,
    Bye,
    ReceiverReport,
    ReportBlock,
    SenderReport,
    build_bye,
    build_report,
    ntp_middle,
    ntp_timestamp,
    parse_rtcp,
    round_trip_seconds,
)


def test_sender_report_round_trip() -> None:
    block = ReportBlock(ssrc=99, fraction_lost=64, cumulative_lost=-3, highest_seq=70000, jitter=42, lsr=7, dlsr=9)
    sender = SenderReport(
        ssrc=1, ntp_timestamp=ntp_timestamp(1_700_000_000.25), rtp_timestamp=12345, packet_count=500, octet_count=80000
    )
    data = build_report(ssrc=1, cname="gw@example", sender=sender, reports=(block,))
    assert len(data) % 4 == 0
    packets = parse_rtcp(data)
    assert packets == [
        SenderReport(
            ssrc=1,
            ntp_timestamp=sender.ntp_timestamp,
            rtp_timestamp=12345,
            packet_count=500,
            octet_count=80000,
            reports=(block,),
        )
    ]


def test_receiver_report_round_trip_and_bye() -> None:
    rr = build_report(ssrc=5, cname="x", reports=(ReportBlock(7, 0, 0, 1, 2, 0, 0),))
    assert parse_rtcp(rr) == [ReceiverReport(ssrc=5, reports=(ReportBlock(7, 0, 0, 1, 2, 0, 0),))]
    bye = parse_rtcp(build_bye(ssrc=5, cname="x", reason="hangup"))
    assert bye == [ReceiverReport(ssrc=5, reports=()), Bye(ssrcs=(5,), reason="hangup")]


def test_ntp_conversion() -> None:
    ntp = ntp_timestamp(0.5)
    assert ntp >> 32 == 2_208_988_800
    assert ntp & 0xFFFFFFFF == 1 << 31
    assert ntp_middle(ntp) == ((2_208_988_800 & 0xFFFF) << 16) | 0x8000


def test_round_trip_time_from_lsr_and_dlsr() -> None:
    sent = ntp_timestamp(1000.0)  # our SR
    # The peer holds it 0.25 s, and the RR arrives 0.4 s after we sent the SR: RTT = 0.15 s.
    block = ReportBlock(1, 0, 0, 0, 0, ntp_middle(sent), int(0.25 * 65536))
    assert round_trip_seconds(block, ntp_timestamp(1000.4)) == pytest.approx(0.15, abs=1e-4)
    assert round_trip_seconds(block._replace(lsr=0), ntp_timestamp(1000.4)) is None
    assert round_trip_seconds(block, ntp_timestamp(1000.1)) is None  # negative: clocks disagree


def _hdr(b0: int, pt: int, words: int) -> bytes:
    return struct.pack("!BBH", b0, pt, words)


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"\x80\xc9\x00", "short"),
        (_hdr(0x40, 201, 1) + b"\x00" * 4, "version"),
        (_hdr(0x80, 201, 5) + b"\x00" * 4, "length"),
        (_hdr(0x81, 202, 1) + b"\x00" * 4, "first_not_report"),
        (_hdr(0x81, 201, 1) + b"\x00" * 4, "report_count"),
        (_hdr(0x81, 200, 6) + b"\x00" * 24, "report_count"),
        (_hdr(0xA0, 201, 1) + b"\x00" * 3 + b"\x09", "padding"),
        (_hdr(0xA0, 201, 1) + b"\x00" * 4 + _hdr(0x80, 201, 1) + b"\x00" * 4, "padding"),
        (_hdr(0x80, 201, 1) + b"\x00" * 4 + b"\x80\xca", "short"),
    ],
)
def test_malformed_rtcp(data: bytes, reason: str) -> None:
    with pytest.raises(RtcpError) as info:
        parse_rtcp(data)
    assert info.value.reason == reason


@given(st.binary(max_size=120))
def test_arbitrary_bytes_raise_only_rtcp_error(data: bytes) -> None:
    try:
        parse_rtcp(data)
    except RtcpError as exc:
        assert exc.reason in RTCP_ERROR_REASONS
