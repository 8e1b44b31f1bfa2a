"""The media-stream protocol core: every message shape both ways, the counters, and bad input counted, not fatal."""

from __future__ import annotations

import base64
import itertools
import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.providers.errors import ProviderConfigError
from gateway.providers.media_stream.audio import AudioBridge
from gateway.providers.media_stream.ledger import PlayoutLedger
from gateway.providers.media_stream.protocol import (
    BotAudioReceived,
    BotCleared,
    BotMarked,
    BotMessageRejected,
    MediaFormat,
    StreamIdentity,
    StreamProtocol,
    twilio_sid,
)
from telcodecs.g711 import ulaw_decode, ulaw_encode

IDENT = StreamIdentity(stream_sid="MZ" + "a" * 32, call_sid="CA" + "b" * 32, account_sid="AC" + "c" * 32)


def protocol(wire: str = "mulaw", **params: str) -> StreamProtocol:
    return StreamProtocol(identity=IDENT, media_format=MediaFormat(wire=wire), custom_parameters=params)  # type: ignore[arg-type]


def decoded(data: bytes) -> dict[str, object]:
    message = json.loads(data)
    assert isinstance(message, dict)
    return message


def test_opening_is_connected_then_a_full_start() -> None:
    connected, start = (decoded(m) for m in protocol(from_number="+15550100", to_number="+15550199").opening())
    assert connected == {"event": "connected", "protocol": "Call", "version": "1.0.0"}
    assert start == {
        "event": "start",
        "sequenceNumber": "1",
        "streamSid": IDENT.stream_sid,
        "start": {
            "streamSid": IDENT.stream_sid,
            "accountSid": IDENT.account_sid,
            "callSid": IDENT.call_sid,
            "tracks": ["inbound"],
            "customParameters": {"from_number": "+15550100", "to_number": "+15550199"},
            "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        },
    }


@pytest.mark.parametrize(
    ("wire", "encoding", "rate", "chunk"),
    [
        ("mulaw", "audio/x-mulaw", 8000, 160),
        ("l16_16k", "audio/x-l16", 16000, 640),
        ("l16_24k", "audio/x-l16", 24000, 960),
    ],
)
def test_media_format_of_each_wire_audio(wire: str, encoding: str, rate: int, chunk: int) -> None:
    fmt = MediaFormat(wire=wire)  # type: ignore[arg-type]
    assert (fmt.encoding, fmt.sample_rate, fmt.chunk_bytes) == (encoding, rate, chunk)
    start = decoded(protocol(wire).opening()[1])
    assert start["start"]["mediaFormat"] == {"encoding": encoding, "sampleRate": rate, "channels": 1}  # type: ignore[index]


def test_media_numbers_sequence_chunk_and_timestamp() -> None:
    p = protocol()
    p.opening()
    messages = [decoded(p.media(bytes([i]) * 160)) for i in range(3)]
    assert [m["sequenceNumber"] for m in messages] == ["2", "3", "4"]
    assert [m["media"]["chunk"] for m in messages] == ["1", "2", "3"]  # type: ignore[index]
    assert [m["media"]["timestamp"] for m in messages] == ["0", "20", "40"]  # type: ignore[index]
    first = messages[0]
    assert first["event"] == "media" and first["streamSid"] == IDENT.stream_sid
    assert first["media"]["track"] == "inbound"  # type: ignore[index]
    assert base64.b64decode(first["media"]["payload"]) == b"\x00" * 160  # type: ignore[index]
    assert p.counters.media_sent == 3


def test_timestamps_follow_the_audio_clock_at_16_khz() -> None:
    p = protocol("l16_16k")
    stamps = [decoded(p.media(b"\x00" * 640))["media"]["timestamp"] for _ in range(3)]  # type: ignore[index]
    assert stamps == ["0", "20", "40"]


def test_dtmf_mark_and_stop_shapes_share_the_sequence() -> None:
    p = protocol()
    p.opening()
    dtmf, mark, stop = decoded(p.dtmf("5")), decoded(p.mark("greeting-done")), decoded(p.stop())
    assert dtmf == {
        "event": "dtmf",
        "sequenceNumber": "2",
        "streamSid": IDENT.stream_sid,
        "dtmf": {"track": "inbound_track", "digit": "5"},
    }
    assert mark == {
        "event": "mark",
        "sequenceNumber": "3",
        "streamSid": IDENT.stream_sid,
        "mark": {"name": "greeting-done"},
    }
    assert stop == {
        "event": "stop",
        "sequenceNumber": "4",
        "streamSid": IDENT.stream_sid,
        "stop": {"accountSid": IDENT.account_sid, "callSid": IDENT.call_sid},
    }
    assert p.stopped
    with pytest.raises(ValueError, match="DTMF"):
        p.dtmf("x")


def test_bot_media_mark_and_clear_are_understood() -> None:
    p = protocol()
    payload = bytes(range(200))
    media = json.dumps(
        {"event": "media", "streamSid": IDENT.stream_sid, "media": {"payload": base64.b64encode(payload).decode()}}
    )
    assert p.receive(media) == (BotAudioReceived(payload=payload),)
    assert p.receive('{"event":"mark","streamSid":"' + IDENT.stream_sid + '","mark":{"name":"m1"}}') == (
        BotMarked(name="m1"),
    )
    assert p.receive('{"event":"clear","streamSid":"' + IDENT.stream_sid + '"}') == (BotCleared(),)
    assert (p.counters.media_received, p.counters.marks_received, p.counters.clears_received) == (1, 1, 1)
    assert not p.counters.rejected and p.counters.foreign_stream_sid == 0


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"event":"clear"}', "binary_frame"),
        ("{not json", "malformed_json"),
        ("[1, 2]", "not_an_object"),
        ('{"event":"start"}', "unknown_event"),
        ('{"noevent":1}', "unknown_event"),
        ('{"event":"media"}', "bad_media"),
        ('{"event":"media","media":{"payload":5}}', "bad_media"),
        ('{"event":"media","media":{"payload":"!!not base64!!"}}', "bad_base64"),
        ('{"event":"media","media":{"payload":""}}', "empty_media"),
        ('{"event":"mark","mark":{}}', "bad_mark"),
        ('{"event":"mark","mark":{"name":""}}', "bad_mark"),
        ('{"event":"mark","mark":"m1"}', "bad_mark"),
    ],
)
def test_bad_messages_are_counted_and_dropped(raw: str | bytes, reason: str) -> None:
    p = protocol()
    (event,) = p.receive(raw)
    assert isinstance(event, BotMessageRejected) and event.reason == reason
    assert p.counters.rejected == {reason: 1}
    # The stream goes on: the next good message is understood.
    assert p.receive('{"event":"clear"}') == (BotCleared(),)


def test_a_foreign_stream_sid_is_accepted_and_counted() -> None:
    p = protocol()
    assert p.receive('{"event":"clear","streamSid":"MZother"}') == (BotCleared(),)
    assert p.counters.foreign_stream_sid == 1


def test_sids_have_twilios_shape() -> None:
    sid = twilio_sid("MZ", "0123456789ABCDEF" * 2)
    assert re.fullmatch(r"MZ[0-9a-f]{32}", sid)
    with pytest.raises(ValueError):
        twilio_sid("CA", "abc")


# ------------------------------------------------------------------------------------------ audio bridge


def _tone(ms: int, rate: int = 24000, freq: float = 440.0) -> np.ndarray:
    t = np.arange(ms * rate // 1000) / rate
    return (8000 * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def test_mulaw_with_a_pcmu_profile_passes_codes_untouched() -> None:
    bridge = AudioBridge(MediaFormat(wire="mulaw"), "pcmu")
    assert bridge.passthrough
    codes = bytes(range(256)) * 2 + bytes(range(128))  # 640 codes = 4 frames
    assert bridge.to_wire(codes) == [codes[i : i + 160] for i in range(0, 640, 160)]
    assert bridge.from_wire(b"\x01\x02\x03") == b"\x01\x02\x03"  # any length, no carry


def test_mulaw_with_a_pcma_profile_translates_the_law() -> None:
    bridge = AudioBridge(MediaFormat(wire="mulaw"), "pcma")
    (chunk,) = bridge.to_wire(b"\xd5" * 160)  # A-law silence (+8)
    assert len(chunk) == 160 and np.abs(ulaw_decode(chunk)).max() <= 8  # mu-law's nearest codes
    assert bridge.from_wire(b"\xff" * 7) == b"\xd5" * 7  # mu-law silence -> A-law silence


def test_mulaw_with_a_pcm24k_profile_resamples_and_reframes() -> None:
    bridge = AudioBridge(MediaFormat(wire="mulaw"), "pcm24k")
    tone = _tone(100)
    chunks = bridge.to_wire(tone.tobytes())
    assert [len(c) for c in chunks] == [160] * 5
    level = np.sqrt(np.mean(ulaw_decode(b"".join(chunks)).astype(float) ** 2))
    assert 5000 < level < 6000  # a 8000-peak sine keeps its level through 24k -> 8k -> mu-law
    wire = ulaw_encode(_tone(100, 8000))
    pcm = bridge.from_wire(wire[:250]) + bridge.from_wire(wire[250:])  # odd sizes: carried across payloads
    assert len(pcm) == 5 * 960
    tail_bridge = AudioBridge(MediaFormat(wire="mulaw"), "pcm24k")
    assert tail_bridge.from_wire(wire[:100]) == b""
    assert len(tail_bridge.flush()) == 960 and tail_bridge.flush() == b""


def test_l16_16k_resamples_and_l16_24k_is_the_frame_contract() -> None:
    b16 = AudioBridge(MediaFormat(wire="l16_16k"), "pcm24k")
    assert [len(c) for c in b16.to_wire(_tone(40).tobytes())] == [640, 640]
    assert len(b16.from_wire(_tone(40, 16000).tobytes())) == 2 * 960
    b24 = AudioBridge(MediaFormat(wire="l16_24k"), "pcm24k")
    assert b24.passthrough
    data = _tone(20).tobytes()
    assert b24.to_wire(data) == [data]
    assert b24.from_wire(data[:11]) + b24.from_wire(data[11:]) == data  # an odd byte waits for its pair


def test_l16_needs_a_pcm24k_profile() -> None:
    with pytest.raises(ProviderConfigError, match="pcm24k"):
        AudioBridge(MediaFormat(wire="l16_16k"), "pcmu")


# ------------------------------------------------------------------------------------------------ ledger


def test_ledger_places_position_markers_and_bounds_the_queue() -> None:
    ledger = PlayoutLedger(max_queued_ms=1000.0, position_every_ms=500.0)
    assert ledger.delivered(400.0) is None
    token = ledger.delivered(200.0)
    assert token is not None and ledger.queued_ms == 600.0
    assert ledger.admits(400.0) and not ledger.admits(401.0)
    assert ledger.reached(token) is None  # a position marker answers nothing
    assert ledger.queued_ms == 0.0
    mark = ledger.bot_mark("greeting")
    assert mark is not None and ledger.bot_marks_pending == 1
    assert ledger.reached(mark) == "greeting" and ledger.bot_marks_pending == 0
    assert ledger.reached(mark) is None  # once only
    ledger.delivered(300.0)
    ledger.cleared()
    assert ledger.queued_ms == 0.0


def test_ledger_refuses_marks_past_its_bound() -> None:
    ledger = PlayoutLedger(max_queued_ms=1000.0, max_marks=2)
    assert ledger.bot_mark("a") and ledger.bot_mark("b")
    assert ledger.bot_mark("c") is None


@settings(max_examples=60, deadline=None)
@given(
    wire=st.sampled_from(["mulaw", "l16_16k", "l16_24k"]),
    cuts=st.lists(st.integers(min_value=0, max_value=4000), max_size=12),
)
def test_bot_audio_converts_the_same_however_it_is_split(wire: str, cuts: list[int]) -> None:
    fmt = MediaFormat(wire=wire)  # type: ignore[arg-type]
    session_format = "pcmu" if wire == "mulaw" and len(cuts) % 2 else "pcm24k"
    stream = (np.arange(4001, dtype=np.int64) * 7919 % 256).astype(np.uint8).tobytes()  # any bytes are audio
    whole = AudioBridge(fmt, session_format)  # type: ignore[arg-type]
    expected = whole.from_wire(stream) + whole.flush()
    split = AudioBridge(fmt, session_format)  # type: ignore[arg-type]
    bounds = [0, *sorted(cuts), len(stream)]
    pieces = [stream[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    assert b"".join(split.from_wire(piece) for piece in pieces) + split.flush() == expected
