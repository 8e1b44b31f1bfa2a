"""RFC 4733 telephone-event receive (one event per press) and send (packet sequence)."""

from __future__ import annotations

import pytest

from gateway.media.errors import DtmfPayloadError, LocalMediaError
from gateway.media.rfc4733 import (
    DtmfReceiver,
    DtmfSender,
    build_telephone_event,
    parse_telephone_event,
    telephone_event_packets,
)


def ev(event: int, duration: int, *, end: bool = False, volume: int = 10) -> bytes:
    return build_telephone_event(event, end=end, volume=volume, duration=duration)


def test_one_event_per_press_with_end_retransmissions() -> None:
    rx = DtmfReceiver("c1")
    out = [rx.feed(8000, ev(5, d), 0.1 * i) for i, d in enumerate((160, 320, 480))]
    out += [rx.feed(8000, ev(5, 640, end=True), 0.5) for _ in range(3)]
    events = [e for e in out if e is not None]
    assert len(events) == 1
    assert (events[0].digit, events[0].rtp_timestamp, events[0].call_id, events[0].received_at) == (
        "5",
        8000,
        "c1",
        0.0,
    )
    assert rx.presses == 1


def test_same_digit_twice_is_two_presses_by_timestamp() -> None:
    rx = DtmfReceiver("c1")
    a = rx.feed(1000, ev(11, 160), 0.0)
    rx.feed(1000, ev(11, 800, end=True), 0.1)
    b = rx.feed(3000, ev(11, 160), 0.3)
    assert a is not None and b is not None and a.digit == b.digit == "#"
    assert rx.feed(1000, ev(11, 800, end=True), 0.4) is None  # a stray late retransmission of the first press


def test_press_seen_only_by_its_end_packets() -> None:
    rx = DtmfReceiver("c1")
    first = rx.feed(500, ev(10, 800, end=True), 0.0)
    assert first is not None and first.digit == "*"
    assert rx.feed(500, ev(10, 800, end=True), 0.02) is None
    assert rx.feed(500, ev(10, 800, end=True), 0.04) is None


def test_long_press_split_into_segments_is_one_press() -> None:
    rx = DtmfReceiver("c1")
    assert rx.feed(0, ev(1, 0xFFFF), 0.0) is not None  # first segment ran to the 16-bit limit
    assert rx.feed(0xFFFF, ev(1, 160), 8.2) is None  # the next segment continues it
    assert rx.feed(0xFFFF, ev(1, 800, end=True), 8.3) is None
    assert rx.presses == 1


def test_unknown_events_and_short_payloads() -> None:
    rx = DtmfReceiver("c1")
    assert rx.feed(0, ev(16, 160), 0.0) is None  # flash: not a DTMF key
    assert rx.ignored == 1
    with pytest.raises(DtmfPayloadError):
        rx.feed(0, b"\x01\x02", 0.0)
    assert parse_telephone_event(ev(9, 1234, end=True, volume=33)) == (9, True, 33, 1234)


def test_packets_for_one_digit() -> None:
    packets = telephone_event_packets("7", duration_ms=100, clock_rate=8000)
    assert [m for m, _ in packets] == [True] + [False] * 6
    parsed = [parse_telephone_event(p) for _, p in packets]
    assert [(e, end, d) for e, end, _, d in parsed] == [
        (7, False, 160),
        (7, False, 320),
        (7, False, 480),
        (7, False, 640),
        (7, True, 800),
        (7, True, 800),
        (7, True, 800),
    ]
    short = telephone_event_packets("A", duration_ms=20, clock_rate=48000)
    assert [m for m, _ in short] == [True, False, False]
    assert parse_telephone_event(short[0][1]) == (12, True, 10, 960)


def test_bad_digits_are_refused() -> None:
    with pytest.raises(LocalMediaError):
        telephone_event_packets("x")
    with pytest.raises(LocalMediaError):
        telephone_event_packets("1", duration_ms=2000, clock_rate=48000)
    sender = DtmfSender(clock_rate=8000)
    with pytest.raises(LocalMediaError):
        sender.queue("12x")
    assert not sender.active  # nothing queued when one digit is invalid


def test_sender_releases_one_packet_per_tick_on_one_timestamp_with_gaps() -> None:
    sender = DtmfSender(clock_rate=8000, gap_ms=40)
    sender.queue("12", duration_ms=60)
    ts = 1000
    out = []
    for _ in range(16):
        out.append(sender.next_packet(ts) if sender.active else None)
        ts += 160
    first = out[:5]  # 2 updates + 3 end packets
    assert all(p is not None for p in first)
    assert {p[2] for p in first if p} == {1000}
    assert out[5] is None and out[6] is None  # 40 ms inter-digit gap: audio flows
    second = [p for p in out[7:12]]
    assert all(p is not None for p in second)
    assert {p[2] for p in second if p} == {1000 + 7 * 160}
    assert second[0] is not None and second[0][0] is True
    assert out[12:] == [None] * 4
    assert sender.sent == 2
