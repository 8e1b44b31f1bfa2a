"""RFC 4733 telephone-event (DTMF) payloads: receive one event per key press, send a digit as packets.

Payload (§2.3): ``event:8 | E:1 R:1 volume:6 | duration:16``. All packets of one key press carry the same RTP
timestamp (the event's start), so the timestamp is the press's identity (§2.5.2.1):

- receive: the first packet seen for a new timestamp yields one :class:`DtmfReceived`, whether it is the
  marked start, an update or already an end packet (the start may be lost). Later updates and the (usually
  three, §2.5.1.4) end retransmissions of the same timestamp are absorbed. A long event split into segments
  (§2.5.1.3: the next segment's timestamp is the previous one plus its duration, same event, no end bit yet)
  continues the press instead of starting a new one. Events other than the 16 DTMF keys are counted, ignored.
- send: :class:`DtmfSender` turns queued digits into per-tick packets: marker on the first, the duration
  growing by one packet time per packet, then three end packets with the final duration, all on the event's
  start timestamp. The outbound tick sends these *instead of* audio for that call while a digit is active.

Redundant payloads (RFC 2198) are not supported; phones send plain RFC 4733.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass

from gateway.media.errors import DtmfPayloadError, LocalMediaError
from gateway.media.rtp import ts_delta

DTMF_DIGITS = "0123456789*#ABCD"
_EVENT = struct.Struct("!BBH")
_RECENT = 8
_SEGMENT_SLACK = 0x1000  # timestamp units: missed updates near a segment boundary


@dataclass(frozen=True, slots=True, kw_only=True)
class DtmfReceived:
    """A caller pressed a key (RFC 4733 telephone-event); one event per key press."""

    call_id: str
    digit: str
    rtp_timestamp: int
    received_at: float


def parse_telephone_event(payload: bytes) -> tuple[int, bool, int, int]:
    """(event code, end bit, volume in -dBm0, duration in timestamp units) of one RFC 4733 payload."""
    if len(payload) < 4:
        raise DtmfPayloadError("short", f"telephone-event payload of {len(payload)} bytes, need 4")
    event, flags, duration = _EVENT.unpack_from(payload)
    return event, bool(flags & 0x80), flags & 0x3F, duration


def build_telephone_event(event: int, *, end: bool, volume: int, duration: int) -> bytes:
    return _EVENT.pack(event, (0x80 if end else 0) | (volume & 0x3F), duration)


class DtmfReceiver:
    """Turns one call's telephone-event packets into :class:`DtmfReceived` events."""

    __slots__ = ("_last_duration", "_last_ended", "_last_event", "_last_ts", "_recent", "call_id", "ignored", "presses")

    def __init__(self, call_id: str) -> None:
        self.call_id = call_id
        self._recent: deque[int] = deque(maxlen=_RECENT)
        self._last_ts: int | None = None
        self._last_event = -1
        self._last_duration = 0
        self._last_ended = True
        self.presses = 0
        self.ignored = 0

    def feed(self, timestamp: int, payload: bytes, now: float) -> DtmfReceived | None:
        """Account for one packet; a new key press returns its event. Raises DtmfPayloadError if malformed."""
        event, end, _volume, duration = parse_telephone_event(payload)
        if event >= len(DTMF_DIGITS):
            self.ignored += 1
            return None
        if timestamp in self._recent:
            if timestamp == self._last_ts:
                self._last_duration = max(self._last_duration, duration)
                self._last_ended = self._last_ended or end
            return None
        last_ts = self._last_ts
        # A segment boundary: the previous segment ran (nearly) to the 16-bit duration limit, never ended, and
        # this timestamp follows it by about that duration.
        continues = (
            last_ts is not None
            and not self._last_ended
            and event == self._last_event
            and self._last_duration >= 0xFFFF - _SEGMENT_SLACK
            and 0 < ts_delta(timestamp, last_ts) <= 0xFFFF + _SEGMENT_SLACK
        )
        self._recent.append(timestamp)
        self._last_ts = timestamp
        self._last_event = event
        self._last_duration = duration
        self._last_ended = end
        if continues:
            return None
        self.presses += 1
        return DtmfReceived(call_id=self.call_id, digit=DTMF_DIGITS[event], rtp_timestamp=timestamp, received_at=now)


def telephone_event_packets(
    digit: str, *, duration_ms: int = 100, volume: int = 10, clock_rate: int = 8000, packet_ms: int = 20
) -> list[tuple[bool, bytes]]:
    """(marker, payload) of every packet for one digit, in send order; all share the event's start timestamp."""
    event = DTMF_DIGITS.find(digit.upper()) if len(digit) == 1 else -1
    if event < 0:
        raise LocalMediaError(f"not a DTMF digit: {digit!r} (one of {DTMF_DIGITS})")
    if not 0 <= volume <= 63:
        raise LocalMediaError(f"volume is 0..63 (-dBm0), got {volume}")
    packets = max(1, -(-duration_ms // packet_ms))
    step = clock_rate * packet_ms // 1000
    if packets * step > 0xFFFF:
        raise LocalMediaError(f"{duration_ms} ms exceeds the 16-bit duration field at {clock_rate} Hz")
    out = [
        (k == 1, build_telephone_event(event, end=False, volume=volume, duration=k * step)) for k in range(1, packets)
    ]
    end = build_telephone_event(event, end=True, volume=volume, duration=packets * step)
    # Three end packets (§2.5.1.4); the first carries the marker only when it also starts the event.
    out.append((not out, end))
    out.extend([(False, end), (False, end)])
    return out


class DtmfSender:
    """Queued outbound digits for one call, released one packet per 20 ms tick."""

    __slots__ = ("_clock_rate", "_current", "_event_ts", "_gap_left", "_gap_ticks", "_index", "_queue", "sent")

    def __init__(self, *, clock_rate: int, gap_ms: int = 40) -> None:
        self._clock_rate = clock_rate
        self._gap_ticks = max(0, gap_ms // 20)
        self._queue: deque[list[tuple[bool, bytes]]] = deque()
        self._current: list[tuple[bool, bytes]] | None = None
        self._index = 0
        self._event_ts = 0
        self._gap_left = 0
        self.sent = 0

    def queue(self, digits: str, *, duration_ms: int = 100, volume: int = 10) -> None:
        """Validate and queue digits; raises LocalMediaError for an invalid digit (nothing is queued then)."""
        packets = [
            telephone_event_packets(d, duration_ms=duration_ms, volume=volume, clock_rate=self._clock_rate)
            for d in digits
        ]
        self._queue.extend(packets)

    @property
    def active(self) -> bool:
        return self._current is not None or bool(self._queue)

    def next_packet(self, audio_timestamp: int) -> tuple[bool, bytes, int] | None:
        """This tick's (marker, payload, rtp timestamp), or None when audio should be sent instead."""
        if self._current is None:
            if self._gap_left > 0:
                self._gap_left -= 1
                return None
            if not self._queue:
                return None
            self._current = self._queue.popleft()
            self._index = 0
            self._event_ts = audio_timestamp
        marker, payload = self._current[self._index]
        self._index += 1
        if self._index == len(self._current):
            self._current = None
            self._gap_left = self._gap_ticks
            self.sent += 1
        return marker, payload, self._event_ts
