"""Per-call rules: symmetric-RTP latching, direction (RFC 3264), RTP sender state, DTMF send, RTCP exchange."""

from __future__ import annotations

import pytest

from gateway.media.call import MediaCall, MediaCallConfig, opus_packet_samples
from gateway.media.errors import LocalMediaError
from gateway.media.rfc4733 import parse_telephone_event
from gateway.media.rtcp import ntp_timestamp
from gateway.media.rtp import RtpPacket, parse_rtp

SIGNALLED = ("192.0.2.10", 4000)


def make_call(**overrides: object) -> MediaCall:
    fields: dict[str, object] = {
        "call_id": "c1",
        "codec": "PCMU",
        "payload_type": 0,
        "telephone_event_pt": 101,
        "remote_rtp": SIGNALLED,
        "ssrc": 0xCAFE,
        "initial_sequence": 65534,
        "initial_timestamp": 2**32 - 160,
    }
    fields.update(overrides)
    return MediaCall(MediaCallConfig(**fields), now=0.0)  # type: ignore[arg-type]


def pkt(seq: int, *, pt: int = 0, ts: int | None = None, payload: bytes = b"\xff" * 160) -> RtpPacket:
    return RtpPacket(False, pt, seq, seq * 160 if ts is None else ts, 42, payload)


def test_latches_to_the_nat_port_of_the_signalled_ip() -> None:
    call = make_call()
    assert call.send_address == SIGNALLED and not call.latched
    assert call.receive(pkt(1), ("198.51.100.7", 4000), 0.0) == "foreign_source"
    assert call.receive(pkt(1, pt=9), ("192.0.2.10", 31000), 0.0) == "unknown_payload_type"
    assert not call.latched  # invalid packets never latch
    assert call.receive(pkt(1), ("192.0.2.10", 31000), 0.0) is None
    assert call.send_address == ("192.0.2.10", 31000) and call.latched
    assert call.receive(pkt(2), ("192.0.2.10", 4000), 0.02) == "foreign_source"  # same IP, other port
    stats = call.stats(1.0)
    assert stats.foreign_source == 2 and stats.dropped["unknown_payload_type"] == 1 and stats.received == 1


def test_latch_any_source_and_relatch_after_reinvite() -> None:
    call = make_call(latch_any_source=True)
    assert call.receive(pkt(1), ("203.0.113.9", 5555), 0.0) is None
    assert call.send_address == ("203.0.113.9", 5555)
    call.update_remote(("192.0.2.99", 6000))
    assert call.send_address == ("192.0.2.99", 6000) and not call.latched
    assert call.rtcp_address == ("192.0.2.99", 6001)


def test_sender_sequence_timestamp_marker_and_wrap() -> None:
    call = make_call()
    packets = [call.next_packet(b"\xff" * 160, has_audio=i >= 2, now=i * 0.02) for i in range(5)]
    parsed = [parse_rtp(p) for p in packets if p is not None]
    assert [p.sequence_number for p in parsed] == [65534, 65535, 0, 1, 2]
    assert [p.timestamp for p in parsed] == [2**32 - 160, 0, 160, 320, 480]
    # Marker on the first packet and on the talkspurt start after silence frames.
    assert [p.marker for p in parsed] == [True, False, True, False, False]
    assert {p.ssrc for p in parsed} == {0xCAFE} and {p.payload_type for p in parsed} == {0}


def test_hold_stops_sending_but_the_clock_runs() -> None:
    call = make_call(initial_sequence=10, initial_timestamp=0)
    first = parse_rtp(call.next_packet(b"\xff" * 160, True, 0.0) or b"")
    call.set_direction("recvonly")  # the peer put us on hold (it offered sendonly)
    assert call.next_packet(b"\xff" * 160, True, 0.02) is None
    assert call.next_packet(b"\xff" * 160, True, 0.04) is None
    call.set_direction("sendrecv")
    resumed = parse_rtp(call.next_packet(b"\xff" * 160, True, 0.06) or b"")
    assert (first.sequence_number, resumed.sequence_number) == (10, 11)
    assert resumed.timestamp == 3 * 160 and resumed.marker
    with pytest.raises(LocalMediaError):
        call.set_direction("sideways")  # type: ignore[arg-type]


def test_ticks_the_clock_skipped_leave_a_timestamp_gap_and_contiguous_sequence_numbers() -> None:
    # A stall the clock could not catch up: the next packet carries the media time it is sent at, so the phone
    # plays it on time (a gap, as with silence suppression) instead of seeing every later packet 60 ms late.
    call = make_call(initial_sequence=10, initial_timestamp=2**32 - 320, codec="PCMU")
    before = parse_rtp(call.next_packet(b"\xff" * 160, True, 0.0) or b"")
    call.skip_ticks(3)
    call.skip_ticks(0)
    after = parse_rtp(call.next_packet(b"\xff" * 160, True, 0.08) or b"")
    assert after.sequence_number == before.sequence_number + 1
    assert (after.timestamp - before.timestamp) % 2**32 == 4 * 160  # wrapped past 2**32 on the way
    assert not after.marker
    opus = make_call(codec="opus", payload_type=111, initial_timestamp=0)
    opus.next_packet(b"\x00", True, 0.0)
    opus.skip_ticks(2)
    assert parse_rtp(opus.next_packet(b"\x00", True, 0.06) or b"").timestamp == 3 * 960


def test_sendonly_ignores_received_audio_but_still_latches() -> None:
    call = make_call(direction="sendonly")
    assert call.receive(pkt(1), SIGNALLED, 0.0) == "direction"
    assert call.latched and call.inactive_for(0.5) == 0.5


def test_inactivity_tracking() -> None:
    call = make_call()
    assert call.inactive_for(3.0) == 3.0  # nothing received since the call was added at 0
    call.receive(pkt(1), SIGNALLED, 4.0)
    assert call.inactive_for(4.25) == 0.25
    call.receive(pkt(2), ("198.51.100.1", 1), 5.0)  # a foreign packet is no sign of life
    assert call.inactive_for(6.0) == 2.0


def test_dtmf_packets_replace_audio_then_audio_resumes() -> None:
    call = make_call(initial_sequence=0, initial_timestamp=8000)
    call.next_packet(b"\xff" * 160, True, 0.0)
    call.send_dtmf("5", duration_ms=40)
    out = [parse_rtp(call.next_packet(b"\x7f" * 160, True, 0.02 * (i + 1)) or b"") for i in range(5)]
    assert [p.payload_type for p in out] == [101, 101, 101, 101, 0]
    assert [p.sequence_number for p in out] == [1, 2, 3, 4, 5]
    assert {p.timestamp for p in out[:4]} == {8160}
    assert out[4].timestamp == 8000 + 5 * 160  # audio timestamps kept running under the event
    assert [p.marker for p in out[:4]] == [True, False, False, False]
    assert [parse_telephone_event(p.payload)[1] for p in out[:4]] == [False, True, True, True]
    with pytest.raises(LocalMediaError):
        make_call(telephone_event_pt=None).send_dtmf("1")


def test_rtcp_exchange_gives_rtt_loss_and_jitter() -> None:
    a = make_call(call_id="a", ssrc=111, remote_rtp=("10.0.0.2", 5000))
    b = make_call(call_id="b", ssrc=222, remote_rtp=("10.0.0.1", 6000))
    # a sends 10 packets to b, one is lost.
    for i in range(10):
        data = a.next_packet(b"\xff" * 160, True, i * 0.02)
        assert data is not None
        if i != 4:
            assert b.receive(parse_rtp(data), ("10.0.0.1", 6000), i * 0.02 + 0.01) is None
    wall = 1_700_000_000.0
    sr = a.rtcp_report(0.2, ntp_timestamp(wall))
    assert b.rtcp_receive(sr, ("10.0.0.1", 6001), ntp_timestamp(wall + 0.03)) is None
    rr = b.rtcp_report(0.3, ntp_timestamp(wall + 0.08))  # b holds the SR 50 ms
    assert a.rtcp_receive(rr, ("10.0.0.2", 5001), ntp_timestamp(wall + 0.11)) is None
    stats = a.stats(0.4)
    assert stats.rtt_ms == pytest.approx(60.0, abs=0.1)
    assert stats.remote_cumulative_lost == 1
    assert stats.remote_fraction_lost == pytest.approx(25 / 256)  # (1 << 8) // 10
    assert stats.remote_jitter_ms == pytest.approx(0.0)
    assert b.stats(0.4).lost == 1


def test_malformed_and_foreign_rtcp_is_counted() -> None:
    call = make_call()
    assert call.rtcp_receive(b"\x80\xc9\x00", SIGNALLED, 0) == "rtcp_malformed_short"
    assert call.rtcp_receive(b"\x80\xc9\x00\x01\x00\x00\x00\x01", ("198.51.100.1", 1), 0) == "rtcp_foreign_source"
    stats = call.stats(0.0)
    assert stats.malformed == 1 and stats.dropped["rtcp_foreign_source"] == 1


def test_opus_toc_durations() -> None:
    assert opus_packet_samples(bytes([0xF8, 0])) == 960  # CELT FB 20 ms, one frame
    assert opus_packet_samples(bytes([0x78])) == 960  # Hybrid FB 20 ms (config 15)
    assert opus_packet_samples(bytes([0x79])) == 1920  # code 1: two frames
    assert opus_packet_samples(bytes([0x4B, 0x03])) == 2880  # SILK WB 20 ms (config 9), code 3 with 3 frames
    assert opus_packet_samples(bytes([0x4B])) == 0  # code 3 without its frame-count byte
    call = make_call(codec="opus", payload_type=111)
    assert call.receive(pkt(1, pt=111, payload=bytes([0x79, 1, 2])), SIGNALLED, 0.0) == "unsupported_ptime"


def test_config_validation() -> None:
    with pytest.raises(LocalMediaError):
        make_call(codec="G729")
    with pytest.raises(LocalMediaError):
        make_call(telephone_event_pt=0)
    with pytest.raises(LocalMediaError):
        make_call(channels=2)
    with pytest.raises(LocalMediaError):
        make_call(ssrc=-1)
