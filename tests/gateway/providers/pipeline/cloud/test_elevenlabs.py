"""The ElevenLabs adapter: its messages against the SDK's models, its word timings against the fake's audio."""

from __future__ import annotations

from typing import Any

import pybase64
import pytest
from elevenlabs.types.close_context import CloseContext
from elevenlabs.types.close_socket import CloseSocket
from elevenlabs.types.initialise_context import InitialiseContext
from elevenlabs.types.keep_context_alive import KeepContextAlive
from elevenlabs.types.send_text_multi import SendTextMulti

from gateway.providers.fakes import speech
from gateway.providers.fakes.fake_elevenlabs import ElevenLabsOptions, FakeElevenLabsServer
from gateway.providers.fakes.vendor_server import Faults
from gateway.providers.pipeline.cloud.elevenlabs import (
    CLOSE_SOCKET,
    ElevenAlignment,
    ElevenLabsConfig,
    ElevenLabsTts,
    build_url,
    close_context,
    initialise_context,
    keep_context_alive,
    send_text,
)
from gateway.providers.pipeline.ports import TtsAudio, TtsDone, TtsFailed, TtsWords, Word
from tests.gateway.providers.pipeline.cloud.helpers import assert_exact, drain, until

pytestmark = pytest.mark.timeout(30)

CLAUSES = ("Sure, your order ", "shipped yesterday. ", "It arrives Friday.")


def config(fake: FakeElevenLabsServer, **changes: Any) -> ElevenLabsConfig:
    return ElevenLabsConfig(url=fake.base_url, api_key="xi-test", voice="voice-1", **changes)


def test_messages_match_the_sdk_models_key_for_key() -> None:
    cfg = ElevenLabsConfig(api_key="k", voice="v", voice_settings={"stability": 0.5, "speed": 1.1})
    assert_exact(InitialiseContext, initialise_context(cfg, "c1"))
    assert_exact(SendTextMulti, send_text("c1", "Hello there."))
    assert send_text("c1", "Hello there.")["text"] == "Hello there. "  # ends with a single space
    assert_exact(KeepContextAlive, keep_context_alive("c1"))
    assert_exact(CloseContext, close_context("c1"))
    assert_exact(CloseSocket, CLOSE_SOCKET)
    url = build_url(ElevenLabsConfig(model="eleven_flash_v2_5", language="de"), "voice id")
    assert url == (
        "wss://api.elevenlabs.io/v1/text-to-speech/voice%20id/multi-stream-input?model_id=eleven_flash_v2_5"
        "&output_format=pcm_24000&auto_mode=false&inactivity_timeout=60&language_code=de"
    )
    assert "k" not in repr(ElevenLabsConfig(api_key="k-secret")).replace("keepalive", "")


def test_alignment_carries_split_words_and_accumulates_offsets() -> None:
    core = ElevenAlignment()
    core.pushed("the order ")
    pcm_100ms = b"\0" * 4800

    def audio(chars: str, starts: list[int]) -> dict[str, Any]:
        durations = [10] * len(chars)
        align = {"chars": list(chars), "charStartTimesMs": starts, "charDurationsMs": durations}
        return {"audio": pybase64.b64encode(pcm_100ms).decode(), "alignment": align, "contextId": "c"}

    first = core.feed(audio("th", [80, 90]))
    second = core.feed(audio("e order ", [0, 10, 20, 30, 40, 50, 60, 70]))
    assert [type(e) for e in first] == [TtsAudio]  # "th" is carried, not emitted as a word
    (words,) = [e for e in second if isinstance(e, TtsWords)]
    assert words.words == (
        Word(text="the", start_ms=80, end_ms=110, char_start=0, char_end=3),
        Word(text="order", start_ms=120, end_ms=170, char_start=4, char_end=9),
    )
    # normalizedAlignment wins over alignment when both are present
    core.pushed("now")
    message = audio("xyz", [0, 10, 20])
    message["normalizedAlignment"] = {
        "chars": list("now"),
        "charStartTimesMs": [0, 10, 20],
        "charDurationsMs": [10, 10, 10],
    }
    core.feed(message)
    (last,) = core.finish()
    assert isinstance(last, TtsWords) and last.words[0].text == "now" and last.words[0].start_ms == 200
    with pytest.raises(ValueError):
        core.feed({"audio": "", "alignment": {"chars": ["a"], "charStartTimesMs": [], "charDurationsMs": []}})
    with pytest.raises(TypeError):
        core.feed({"audio": "", "alignment": {"chars": ["a"], "charStartTimesMs": ["0"], "charDurationsMs": [1]}})
    # Fractional milliseconds are rounded, not refused.
    core.pushed(" ok")
    (words,) = core.feed(
        {
            "audio": "",
            "alignment": {
                "chars": list(" ok "),
                "charStartTimesMs": [0, 10.4, 20.6, 30],
                "charDurationsMs": [10, 10, 9.5, 5],
            },
        }
    )
    assert isinstance(words, TtsWords) and (words.words[0].start_ms, words.words[0].end_ms) == (310, 331)
    with pytest.raises(ValueError):
        core.feed({"audio": "not base64!"})


async def test_word_timings_are_exact_across_chunks_and_clauses() -> None:
    async with FakeElevenLabsServer(ElevenLabsOptions(pace=0, chunk_ms=100), api_key="xi-test") as fake:
        tts = ElevenLabsTts(config(fake))
        stream = await tts.open("item-1")
        for clause in CLAUSES:
            await stream.push(clause)
        await stream.flush()
        events = await drain(stream.events())
        await tts.aclose()
    assert isinstance(events[-1], TtsDone)
    audio = b"".join(e.pcm for e in events if isinstance(e, TtsAudio))
    words = [w for e in events if isinstance(e, TtsWords) for w in e.words]
    text = "".join(CLAUSES)
    expected: list[Word] = []
    expected_audio = b""
    base = 0
    for index, clause in enumerate(CLAUSES):
        sent = clause if clause.endswith(" ") else clause + " "
        pcm, spoken = speech.render(sent, lead_ms=speech.LEAD_MS if index == 0 else 0)
        offset_ms = len(expected_audio) // 48
        expected += [
            Word(
                text=w.text,
                start_ms=offset_ms + w.start_ms,
                end_ms=offset_ms + w.end_ms,
                char_start=base + w.char_start,
                char_end=base + w.char_end,
            )
            for w in spoken
        ]
        expected_audio += pcm
        base += len(clause)
    assert audio == expected_audio
    assert words == expected
    assert [text[w.char_start : w.char_end] for w in words] == text.split()
    received = fake.record(1).received
    assert received[0] == {"text": " ", "context_id": "item-1"}
    assert received[-2:] == [{"context_id": "item-1", "close_context": True}, {"close_socket": True}]
    models = [InitialiseContext] + [SendTextMulti] * 3 + [CloseContext, CloseSocket]
    for model, message in zip(models, received, strict=True):
        assert_exact(model, message)


async def test_cancel_stops_audio_and_late_audio_is_dropped() -> None:
    async with FakeElevenLabsServer(ElevenLabsOptions(pace=4.0, chunk_ms=50), api_key="xi-test") as fake:
        tts = ElevenLabsTts(config(fake))
        stream = await tts.open("item-1")
        await stream.push("A long sentence that takes well over a second to speak out loud. ")
        first = await until(stream.events(), TtsAudio)
        await stream.cancel()
        assert await drain(stream.events(), within_s=2) == []
        nxt = await tts.open("item-2")
        await nxt.push("Next. ")
        await nxt.flush()
        after = await drain(nxt.events())
        await tts.aclose()
    assert len(first) == 1
    assert isinstance(after[-1], TtsDone)
    assert {"context_id": "item-1", "close_context": True} in fake.record(1).received
    # The service finishes item-1's flushed audio; none of it reached item-2's stream.
    heard = sum(len(e.pcm) for e in after if isinstance(e, TtsAudio))
    assert heard == len(speech.render("Next. ", lead_ms=speech.LEAD_MS)[0])


async def test_keepalive_holds_an_idle_context_open() -> None:
    async with FakeElevenLabsServer(ElevenLabsOptions(pace=0), api_key="xi-test") as fake:
        tts = ElevenLabsTts(config(fake, inactivity_timeout_s=1, keepalive_s=0.2))
        stream = await tts.open("item-1")
        await stream.push("Hi. ")
        await until(stream.events(), TtsWords)
        await fake.server.wait_until(
            lambda: fake.record(1).received.count({"text": "", "context_id": "item-1"}) >= 3, within_s=5
        )
        await stream.push("Still here. ")
        await stream.flush()
        events = await drain(stream.events())
        await tts.aclose()
    assert isinstance(events[-1], TtsDone)
    assert fake.record(1).close_code != 1008  # never closed for inactivity


async def test_bad_key_fails_not_retryable_and_malformed_frame_fails_retryable() -> None:
    async with FakeElevenLabsServer(api_key="right") as fake:
        tts = ElevenLabsTts(ElevenLabsConfig(url=fake.base_url, api_key="wrong", voice="v"))
        (failed,) = await drain((await tts.open("item-1")).events())
        await tts.aclose()
    assert isinstance(failed, TtsFailed) and not failed.retryable and "401" in failed.message
    async with FakeElevenLabsServer(ElevenLabsOptions(pace=0), faults=Faults(bad_frame_after=1)) as fake:
        tts = ElevenLabsTts(ElevenLabsConfig(url=fake.base_url, voice="v"))
        stream = await tts.open("item-1")
        await stream.push("Hello there, friend. ")
        events = await drain(stream.events())
        assert tts.malformed_frames == 1
        await tts.aclose()
    assert isinstance(events[-1], TtsFailed) and events[-1].retryable and "malformed" in events[-1].message


async def test_dropped_socket_fails_the_stream_and_the_next_open_reconnects() -> None:
    faults = Faults(drop_after_s=0.3, fault_connections=1)
    async with FakeElevenLabsServer(ElevenLabsOptions(pace=1.0), faults=faults) as fake:
        tts = ElevenLabsTts(ElevenLabsConfig(url=fake.base_url, voice="v"))
        stream = await tts.open("item-1")
        await stream.push("A long sentence that takes well over a second to speak out loud. ")
        events = await drain(stream.events())
        assert isinstance(events[-1], TtsFailed) and events[-1].retryable
        stream = await tts.open("item-2")
        await stream.push("Back. ")
        await stream.flush()
        assert isinstance((await drain(stream.events()))[-1], TtsDone)
        await tts.aclose()
    assert len(fake.server.records) == 2
