"""The Deepgram adapter: its URL and messages against the SDK, recognition and healing against the fake."""

from __future__ import annotations

import inspect
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import numpy as np
import pytest
from deepgram.listen.v1.client import AsyncV1Client
from deepgram.listen.v1.types import ListenV1CloseStream, ListenV1Finalize, ListenV1KeepAlive

from gateway.providers import fake_audio
from gateway.providers.errors import ProviderConnectError
from gateway.providers.fakes import speech
from gateway.providers.fakes.fake_deepgram import DeepgramOptions, FakeDeepgramServer
from gateway.providers.fakes.vendor_server import Faults
from gateway.providers.pipeline.cloud.deepgram import (
    CLOSE_STREAM,
    FINALIZE,
    KEEPALIVE,
    DeepgramConfig,
    DeepgramParser,
    DeepgramStt,
    build_url,
    open_deepgram,
)
from gateway.providers.pipeline.ports import SttFailed, SttFinal, SttPartial, SttSpeechStarted, SttUtteranceEnd
from tests.gateway.providers.pipeline.cloud.helpers import assert_exact, drain, until

pytestmark = [
    pytest.mark.timeout(30),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),  # the SDK imports websockets' legacy client
]

FRAME = 640  # 20 ms of PCM16 at 16 kHz


def frames(audio: bytes, size: int = FRAME) -> list[bytes]:
    return [audio[i : i + size] for i in range(0, len(audio), size)]


def speech_16k(text: str) -> bytes:
    return speech.render(text, sample_rate=16_000)[0]


def config(fake: FakeDeepgramServer, **changes: Any) -> DeepgramConfig:
    return DeepgramConfig(url=fake.url, api_key="dg-test", **changes)


def test_url_and_messages_match_the_sdk() -> None:
    cfg = DeepgramConfig(api_key="secret", encoding="mulaw", sample_rate=8000, keyterms=("refund", "order"))
    parts = urlsplit(build_url(cfg))
    assert (parts.scheme, parts.netloc, parts.path) == ("wss", "api.deepgram.com", "/v1/listen")
    query = parse_qsl(parts.query)
    accepted = set(inspect.signature(AsyncV1Client.connect).parameters)
    assert {k for k, _ in query} <= accepted  # every parameter is one the SDK's connect() names
    assert dict(query)["encoding"] == "mulaw" and [v for k, v in query if k == "keyterm"] == ["refund", "order"]
    assert ("endpointing", "false") in parse_qsl(urlsplit(build_url(DeepgramConfig(endpointing_ms=None))).query)
    assert_exact(ListenV1KeepAlive, KEEPALIVE)
    assert_exact(ListenV1Finalize, FINALIZE)
    assert_exact(ListenV1CloseStream, CLOSE_STREAM)
    assert "secret" not in repr(cfg)
    with pytest.raises(ValueError, match="linear16"):
        DeepgramConfig(encoding="mulaw", sample_rate=16000)
    with pytest.raises(ValueError, match="10 s"):
        DeepgramConfig(keepalive_s=12)


def test_parser_maps_messages_into_the_call_timeline() -> None:
    parser = DeepgramParser(offset_ms=1500)

    def results(text: str, **flags: Any) -> dict[str, Any]:
        alt = {"transcript": text, "confidence": 0.9, "words": []}
        return {
            "type": "Results",
            "channel_index": [0, 1],
            "start": 0.5,
            "duration": 1.25,
            "channel": {"alternatives": [alt]},
            "metadata": {},
            **flags,
        }

    assert parser.parse({"type": "SpeechStarted", "channel": [0, 1], "timestamp": 0.42}) == [
        SttSpeechStarted(at_ms=1920)
    ]
    assert parser.parse(results("hel", is_final=False)) == [SttPartial(text="hel")]
    assert parser.parse(results("", is_final=False)) == []
    assert parser.parse(results("", is_final=True)) == []  # confirms audio, says nothing
    assert parser.confirmed_ms == 1750
    assert parser.parse(results("hello", is_final=True, speech_final=True)) == [
        SttFinal(text="hello", speech_final=True)
    ]
    assert parser.parse(results("", is_final=True, from_finalize=True)) == [SttFinal(text="", from_finalize=True)]
    assert parser.finalize_answered
    assert parser.parse({"type": "UtteranceEnd", "channel": [0, 1], "last_word_end": 2.0}) == [
        SttUtteranceEnd(last_word_end_ms=3500)
    ]
    assert parser.parse({"type": "Metadata", "request_id": "r"}) == []
    (error,) = parser.parse({"type": "Error", "variant": "x", "description": "bad audio"})
    assert isinstance(error, SttFailed) and "bad audio" in error.message
    with pytest.raises(KeyError):
        parser.parse({"type": "Results", "is_final": True})


async def test_recognises_an_utterance_with_partials_endpoint_and_utterance_end() -> None:
    options = DeepgramOptions(transcripts=("my order number is four five",), interim_ms=300)
    async with FakeDeepgramServer(options, api_key="dg-test") as fake:
        stt = await open_deepgram(config(fake))
        audio = b"\0" * (32 * 200) + speech_16k("My order number is four five.") + b"\0" * (32 * 1400)
        for frame in frames(audio):
            stt.feed(frame)
        events = await until(stt.events(), SttUtteranceEnd)
        await stt.aclose()
        assert await drain(stt.events()) == []
    kinds = [type(e).__name__ for e in events]
    assert kinds[0] == "SttSpeechStarted" and kinds[-1] == "SttUtteranceEnd"
    assert events[0] == SttSpeechStarted(at_ms=220)
    assert "SttPartial" in kinds
    (final,) = [e for e in events if isinstance(e, SttFinal)]
    assert final == SttFinal(text="my order number is four five", speech_final=True)
    record = fake.record(1)
    assert bytes(record.audio) == audio
    assert record.received_types()[-1] == "CloseStream"
    sdk_models = {"KeepAlive": ListenV1KeepAlive, "Finalize": ListenV1Finalize, "CloseStream": ListenV1CloseStream}
    for message in record.received:  # what went over the wire, not only what the builders return
        assert_exact(sdk_models[message["type"]], message)
    assert record.sent[-1]["type"] == "Metadata" and record.close_code == 1000
    query = record.query
    assert (query["encoding"], query["sample_rate"], query["endpointing"], query["utterance_end_ms"]) == (
        "linear16",
        "16000",
        "300",
        "1000",
    )


async def test_finalize_decides_at_once_and_g711_goes_as_is() -> None:
    async with FakeDeepgramServer(DeepgramOptions(transcripts=("yes please",))) as fake:
        stt = await open_deepgram(config(fake, encoding="mulaw", sample_rate=8000, endpointing_ms=None))
        pcm8k = speech.render("Yes please.", sample_rate=8000)[0]
        ulaw = fake_audio.encode("audio/pcmu", np.frombuffer(pcm8k, dtype="<i2"))
        for frame in frames(ulaw, 160):
            stt.feed(frame)
        stt.finalize()
        events = await until(stt.events(), SttFinal)
        await stt.aclose()
    assert events[-1] == SttFinal(text="yes please", from_finalize=True)
    assert bytes(fake.record(1).audio) == ulaw
    assert fake.record(1).received_types()[:1] == ["Finalize"]


async def test_socket_drop_is_healed_without_losing_caller_audio() -> None:
    options = DeepgramOptions(transcripts=("hello world",), silence_final_ms=400)
    faults = Faults(drop_after_messages=40, fault_connections=1)  # 40 frames = 800 ms: mid-speech
    async with FakeDeepgramServer(options, faults=faults) as fake:
        stt = await open_deepgram(config(fake, reconnect_backoff_s=0.01))
        fed = b"\0" * (32 * 600) + speech_16k("Hello world.") + b"\0" * (32 * 800)
        for frame in frames(fed):
            stt.feed(frame)
        events = await until(stt.events(), SttFinal)
        assert stt.reconnects == 1
        await stt.aclose()
    first, second = bytes(fake.record(1).audio), bytes(fake.record(2).audio)
    assert fed.startswith(first) and fed.endswith(second)
    assert len(first) + len(second) >= len(fed)  # the replay overlaps what the first stream heard: no gap
    assert len(second) < len(fed)  # only the unconfirmed tail was replayed
    onsets = {e.at_ms for e in events if isinstance(e, SttSpeechStarted)}
    assert onsets == {620}  # both streams place the onset at the same call time
    assert events[-1] == SttFinal(text="hello world", speech_final=True)


async def test_keepalive_holds_an_idle_stream_open() -> None:
    async with FakeDeepgramServer(DeepgramOptions(idle_timeout_s=0.5)) as fake:
        stt = await open_deepgram(config(fake, keepalive_s=0.15))
        await fake.server.wait_until(lambda: fake.record(1).received_types().count("KeepAlive") >= 5, within_s=5)
        assert fake.server.live  # never closed for idleness (0.5 s here)
        await stt.aclose()
    assert stt.reconnects == 0


async def test_bad_key_is_not_retryable_and_a_malformed_frame_ends_the_recogniser() -> None:
    async with FakeDeepgramServer(api_key="right") as fake:
        with pytest.raises(ProviderConnectError) as refused:
            await open_deepgram(DeepgramConfig(url=fake.url, api_key="wrong"))
    assert not refused.value.retryable and "401" in str(refused.value)
    options = DeepgramOptions(transcripts=("still here",), silence_final_ms=200)
    async with FakeDeepgramServer(options, faults=Faults(bad_frame_after=1)) as fake:
        stt = await open_deepgram(config(fake))
        for frame in frames(b"\0" * (32 * 300) + speech_16k("Still here.") + b"\0" * (32 * 500)):
            stt.feed(frame)
        events = await drain(stt.events())
        await stt.aclose()
    # The first server message was followed by garbage: counted, reported as the last event, retryable.
    assert isinstance(events[-1], SttFailed) and events[-1].retryable and "malformed" in events[-1].message
    assert stt.malformed_frames == 1 and not any(isinstance(e, SttFailed) for e in events[:-1])


async def test_reconnects_exhausted_fail_the_recogniser() -> None:
    faults = Faults(drop_after_messages=1)
    async with FakeDeepgramServer(faults=faults) as fake:
        stt = DeepgramStt(config(fake, reconnect_attempts=2, reconnect_backoff_s=0.01))
        await stt.start()
        stt.feed(b"\0" * FRAME)
        events = await drain(stt.events())
        await fake.server.wait_until(lambda: len(fake.server.records) == 3)
        # Each reconnect is refused once it sends: the last attempt's drop ends it.
        await stt.aclose()
    assert isinstance(events[-1], SttFailed)


async def test_a_finalize_lost_in_a_drop_is_sent_again() -> None:
    speech_frames = frames(b"\0" * (32 * 200) + speech_16k("Yes please."))
    # The fake drops the socket when the Finalize arrives, before answering it.
    faults = Faults(drop_after_messages=len(speech_frames) + 1, fault_connections=1)
    async with FakeDeepgramServer(DeepgramOptions(transcripts=("yes please",)), faults=faults) as fake:
        stt = await open_deepgram(config(fake, endpointing_ms=None, reconnect_backoff_s=0.01))
        for frame in speech_frames:
            stt.feed(frame)
        stt.finalize()
        events = await until(stt.events(), SttFinal)
        await stt.aclose()
    assert events[-1] == SttFinal(text="yes please", from_finalize=True)
    assert fake.record(1).received_types() == ["Finalize"]
    assert fake.record(2).received_types()[0] == "Finalize"
    assert fed_audio_covered(b"".join(speech_frames), fake)


def fed_audio_covered(fed: bytes, fake: FakeDeepgramServer) -> bool:
    first, second = bytes(fake.record(1).audio), bytes(fake.record(2).audio)
    return fed.startswith(first) and fed.endswith(second) and len(first) + len(second) >= len(fed)


async def test_a_backlog_over_the_replay_limit_fails_instead_of_dropping_audio() -> None:
    async with FakeDeepgramServer() as fake:
        stt = await open_deepgram(config(fake, replay_limit_s=0.1))  # 3200 bytes at 16 kHz
        for _ in range(6):  # fed synchronously: nothing is sent in between
            stt.feed(b"\0" * FRAME)
        events = await drain(stt.events())
        await stt.aclose()
    assert len(events) == 1 and isinstance(events[0], SttFailed) and events[0].retryable
    assert "backlog" in events[0].message
