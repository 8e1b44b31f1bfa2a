"""The media-stream protocol, sans-I/O: the gateway's side of a Twilio-Media-Streams-compatible websocket.

The gateway plays Twilio's part (it is the websocket client, the bot is the server). Messages are JSON text
frames; every value Twilio sends as a string (``sequenceNumber``, ``chunk``, ``timestamp``) is a string here too.

Gateway -> bot (built by :class:`StreamProtocol`, in this order)::

    connected   {"event":"connected","protocol":"Call","version":"1.0.0"}                   no sequenceNumber
    start       sequenceNumber "1"; start.{streamSid,accountSid,callSid,tracks,customParameters,mediaFormat}
    media       start.sequenceNumber + 1, ...; media.{track:"inbound",chunk,timestamp,payload}  one per 20 ms
    dtmf        dtmf.{track:"inbound_track",digit}
    mark        mark.{name}   the echo of a bot mark once the audio before it was played (or cleared)
    stop        stop.{accountSid,callSid}   last, then the socket is closed with 1000

``chunk`` counts media messages from "1"; ``timestamp`` is the position of the chunk's first sample in the
stream, in milliseconds from "0" (the audio clock, exact, not the wall clock).

Bot -> gateway (parsed by :meth:`StreamProtocol.receive` into :class:`BotEvent` values)::

    media       media.payload   base64 audio in the stream's mediaFormat, any length
    mark        mark.name       answered with our mark once the audio sent before it has been played
    clear       -               drop the audio not yet played; pending marks are answered at once

Anything else is counted and dropped, never fatal (Twilio's warnings 31950/31951 say the same of its side):
binary frames, bad JSON, a non-object, an unknown event, a media message without a valid base64 payload, a
mark without a name. A ``streamSid`` other than ours is accepted and counted (``foreign_stream_sid``).
"""

from __future__ import annotations

import binascii
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import pybase64

WireAudio = Literal["mulaw", "l16_16k", "l16_24k"]

_ENCODINGS: Mapping[WireAudio, tuple[str, int, int]] = {
    # wire name: (mediaFormat.encoding, sampleRate, bytes per sample)
    "mulaw": ("audio/x-mulaw", 8000, 1),
    "l16_16k": ("audio/x-l16", 16000, 2),
    "l16_24k": ("audio/x-l16", 24000, 2),
}
CHUNK_MS = 20
MAX_MARK_NAME = 256  # characters; longer names are refused (a mark is echoed verbatim)
DTMF_DIGITS = frozenset("0123456789*#ABCD")


@dataclass(frozen=True, slots=True, kw_only=True)
class MediaFormat:
    """The audio both directions carry: ``encoding`` and ``sample_rate`` as sent in ``start.mediaFormat``."""

    wire: WireAudio = "mulaw"

    @property
    def encoding(self) -> str:
        return _ENCODINGS[self.wire][0]

    @property
    def sample_rate(self) -> int:
        return _ENCODINGS[self.wire][1]

    @property
    def sample_bytes(self) -> int:
        return _ENCODINGS[self.wire][2]

    @property
    def chunk_bytes(self) -> int:
        """Bytes of one 20 ms media message (160 for 8 kHz mu-law)."""
        return self.sample_rate * CHUNK_MS // 1000 * self.sample_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamIdentity:
    """Twilio-shaped ids: 34 characters, ``MZ``/``CA``/``AC`` and 32 hex digits (see :func:`twilio_sid`)."""

    stream_sid: str
    call_sid: str
    account_sid: str


def twilio_sid(prefix: str, hex32: str) -> str:
    """``prefix`` + 32 lowercase hex digits, the shape bots may check (``^MZ[0-9a-fA-F]{32}$``)."""
    digits = "".join(c for c in hex32.lower() if c in "0123456789abcdef")
    if len(digits) < 32:
        raise ValueError("a SID needs 32 hex digits")
    return prefix + digits[:32]


# ------------------------------------------------------------------------------------------ bot events


@dataclass(frozen=True, slots=True, kw_only=True)
class BotEvent:
    """Base of what the bot's messages mean."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BotAudioReceived(BotEvent):
    """Audio to play to the caller, in the stream's media format (any length, as the bot sent it)."""

    payload: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class BotMarked(BotEvent):
    """The bot asks to hear ``name`` back once the audio it sent before it has been played."""

    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class BotCleared(BotEvent):
    """The bot interrupts its own audio: what was not yet played is dropped (a barge-in)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BotMessageRejected(BotEvent):
    """A message we could not use; ``reason`` is the counter it was counted under."""

    reason: str
    detail: str


# -------------------------------------------------------------------------------------------- protocol


@dataclass(slots=True, kw_only=True)
class StreamCounters:
    """What crossed the socket, for stats and logs."""

    media_sent: int = 0
    media_received: int = 0
    marks_received: int = 0
    marks_sent: int = 0
    clears_received: int = 0
    dtmf_sent: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    foreign_stream_sid: int = 0


class StreamProtocol:
    """One stream (one websocket connection): message builders with the sequence counters, and the parser."""

    def __init__(
        self,
        *,
        identity: StreamIdentity,
        media_format: MediaFormat,
        custom_parameters: Mapping[str, str],
    ) -> None:
        self.identity = identity
        self.media_format = media_format
        self.custom_parameters = dict(custom_parameters)
        self.counters = StreamCounters()
        self._sequence = 0  # of the last numbered message sent
        self._chunk = 0
        self._sent_bytes = 0  # audio bytes sent in media messages: the stream's audio clock
        sid = identity.stream_sid.encode()
        # The head of every media message but its three numbers, built once (media() runs per call per tick).
        self._media_head = b'{"event":"media","streamSid":"' + sid + b'","sequenceNumber":"'
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def _next_sequence(self) -> str:
        self._sequence += 1
        return str(self._sequence)

    # ------------------------------------------------------------------------------------- outgoing

    def opening(self) -> list[bytes]:
        """``connected`` then ``start``: the first two text frames, before any media."""
        ident = self.identity
        fmt = self.media_format
        connected = {"event": "connected", "protocol": "Call", "version": "1.0.0"}
        start = {
            "event": "start",
            "sequenceNumber": self._next_sequence(),
            "streamSid": ident.stream_sid,
            "start": {
                "streamSid": ident.stream_sid,
                "accountSid": ident.account_sid,
                "callSid": ident.call_sid,
                "tracks": ["inbound"],
                "customParameters": self.custom_parameters,
                "mediaFormat": {"encoding": fmt.encoding, "sampleRate": fmt.sample_rate, "channels": 1},
            },
        }
        return [orjson.dumps(connected), orjson.dumps(start)]

    def media(self, payload: bytes) -> bytes:
        """One ``media`` message carrying ``payload`` (raw audio in the media format, normally 20 ms)."""
        self._chunk += 1
        fmt = self.media_format
        timestamp = self._sent_bytes // fmt.sample_bytes * 1000 // fmt.sample_rate
        self._sent_bytes += len(payload)
        self.counters.media_sent += 1
        # Written out by hand: base64 needs no JSON escaping, and this runs for every call on every tick.
        return b"".join(
            (
                self._media_head,
                self._next_sequence().encode(),
                b'","media":{"track":"inbound","chunk":"',
                str(self._chunk).encode(),
                b'","timestamp":"',
                str(timestamp).encode(),
                b'","payload":"',
                pybase64.b64encode(payload),
                b'"}}',
            )
        )

    def dtmf(self, digit: str) -> bytes:
        if digit not in DTMF_DIGITS:
            raise ValueError(f"not a DTMF digit: {digit!r}")
        self.counters.dtmf_sent += 1
        return self._numbered("dtmf", {"track": "inbound_track", "digit": digit})

    def mark(self, name: str) -> bytes:
        """Our answer to a bot mark: the same name."""
        self.counters.marks_sent += 1
        return self._numbered("mark", {"name": name})

    def stop(self) -> bytes:
        self._stopped = True
        ident = self.identity
        return self._numbered("stop", {"accountSid": ident.account_sid, "callSid": ident.call_sid})

    def _numbered(self, event: str, body: Mapping[str, Any]) -> bytes:
        return orjson.dumps(
            {
                "event": event,
                "sequenceNumber": self._next_sequence(),
                "streamSid": self.identity.stream_sid,
                event: body,
            }
        )

    # ------------------------------------------------------------------------------------- incoming

    def receive(self, raw: str | bytes) -> Sequence[BotEvent]:
        """One websocket message from the bot -> at most one event (a rejection is an event too)."""
        if isinstance(raw, bytes):
            return (self._reject("binary_frame", f"{len(raw)} bytes in a binary frame; the protocol is JSON text"),)
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return (self._reject("malformed_json", _excerpt(raw)),)
        if not isinstance(message, dict):
            return (self._reject("not_an_object", _excerpt(raw)),)
        event = message.get("event")
        sid = message.get("streamSid")
        if sid is not None and sid != self.identity.stream_sid:
            self.counters.foreign_stream_sid += 1
        if event == "media":
            return (self._media(message),)
        if event == "mark":
            mark = message.get("mark")
            name = mark.get("name") if isinstance(mark, dict) else None
            if not isinstance(name, str) or not name or len(name) > MAX_MARK_NAME:
                return (self._reject("bad_mark", "mark.name must be a non-empty string"),)
            self.counters.marks_received += 1
            return (BotMarked(name=name),)
        if event == "clear":
            self.counters.clears_received += 1
            return (BotCleared(),)
        return (self._reject("unknown_event", f"event {str(event)[:40]!r}"),)

    def _media(self, message: Mapping[str, Any]) -> BotEvent:
        media = message.get("media")
        payload = media.get("payload") if isinstance(media, dict) else None
        if not isinstance(payload, str):
            return self._reject("bad_media", "media.payload must be a base64 string")
        try:
            audio = pybase64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            return self._reject("bad_base64", f"media.payload is not base64 ({len(payload)} characters)")
        if not audio:
            return self._reject("empty_media", "media.payload is empty")
        self.counters.media_received += 1
        return BotAudioReceived(payload=audio)

    def _reject(self, reason: str, detail: str) -> BotMessageRejected:
        self.counters.rejected[reason] += 1
        return BotMessageRejected(reason=reason, detail=detail)


def _excerpt(raw: str, limit: int = 60) -> str:
    return repr(raw[:limit]) + ("..." if len(raw) > limit else "")
