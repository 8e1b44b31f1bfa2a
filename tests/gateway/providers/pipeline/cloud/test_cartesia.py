"""The Cartesia adapter: its messages against the SDK's models, its word timings against the fake's audio."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from cartesia.types.generation_request import GenerationRequest
from cartesia.types.websocket_client_event import CancelContextRequest

from gateway.providers.fakes import speech
from gateway.providers.fakes.fake_cartesia import CartesiaOptions, FakeCartesiaServer
from gateway.providers.fakes.vendor_server import Faults
from gateway.providers.pipeline.cloud.cartesia import (
    CartesiaConfig,
    CartesiaContext,
    CartesiaTts,
    cancel_request,
    generation_request,
)
from gateway.providers.pipeline.ports import TtsAudio, TtsDone, TtsFailed, TtsWords, Word
from tests.gateway.providers.pipeline.cloud.helpers import assert_exact, drain, until

pytestmark = pytest.mark.timeout(30)

TEXT = ("Sure, your order ", "shipped yesterday. ", "It arrives Friday.")


def config(fake: FakeCartesiaServer, **changes: Any) -> CartesiaConfig:
    return CartesiaConfig(url=fake.url, api_key="sk-test", voice="voice-1", **changes)


def test_messages_match_the_sdk_models_key_for_key() -> None:
    cfg = CartesiaConfig(api_key="k", voice="v")
    for more in (True, False):
        request = generation_request(cfg, context_id="item-1", transcript="Hi. ", voice="", more=more)
        assert assert_exact(GenerationRequest, request).continue_ is more
    cancel = cancel_request("item-1")
    assert_exact(CancelContextRequest, cancel)


def test_config_repr_hides_the_key() -> None:
    assert "sk-secret" not in repr(CartesiaConfig(api_key="sk-secret"))


def test_core_places_words_in_the_pushed_text_and_rejects_garbage() -> None:
    context = CartesiaContext("c")
    context.pushed("It costs $5, okay? ")
    stamps = {
        "words": ["It", "costs", "five", "dollars,", "okay?"],
        "start": [0.0, 0.2, 0.5, 0.8, 1.0],
        "end": [0.1, 0.4, 0.7, 0.9, 1.2],
    }
    (event,) = context.on_message({"type": "timestamps", "context_id": "c", "word_timestamps": stamps})
    assert isinstance(event, TtsWords)
    spans = [(w.text, context.text[w.char_start : w.char_end], w.start_ms) for w in event.words]
    # "five" and "dollars," are not in the text: they take the next tokens, so offsets stay monotonic.
    assert spans == [
        ("It", "It", 0),
        ("costs", "costs", 200),
        ("five", "$5,", 500),
        ("dollars,", "okay?", 800),
        ("okay?", "", 1000),
    ]
    with pytest.raises(ValueError):
        context.on_message({"type": "timestamps", "word_timestamps": {"words": ["a"], "start": [], "end": []}})
    with pytest.raises(KeyError):
        context.on_message({"no": "type"})
    (failed,) = context.on_message({"type": "error", "status_code": 401, "title": "Unauthorized", "done": True})
    assert failed == TtsFailed(message="cartesia 401: Unauthorized", retryable=False)


async def test_word_timings_are_exact_and_accumulate_across_pushes() -> None:
    async with FakeCartesiaServer(CartesiaOptions(pace=0)) as fake:
        tts = CartesiaTts(config(fake))
        stream = await tts.open("item-1")
        for clause in TEXT:
            await stream.push(clause)
        await stream.flush()
        events = await drain(stream.events())
        await tts.aclose()
    assert isinstance(events[-1], TtsDone)
    audio = b"".join(e.pcm for e in events if isinstance(e, TtsAudio))
    words = [w for e in events if isinstance(e, TtsWords) for w in e.words]
    text = "".join(TEXT)
    expected: list[Word] = []
    offset_ms = 0
    expected_audio = b""
    for index, clause in enumerate(TEXT):
        pcm, spoken = speech.render(clause, lead_ms=speech.LEAD_MS if index == 0 else 0)
        base = sum(len(c) for c in TEXT[:index])
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
        offset_ms += len(pcm) // 48
        expected_audio += pcm
    assert audio == expected_audio
    assert words == expected
    assert [text[w.char_start : w.char_end] for w in words] == text.split()
    assert words[-1].start_ms > 2000  # the third clause is placed after the first two, never reset
    sent = fake.record(1).received
    assert [m["continue"] for m in sent] == [True, True, True, False]
    for message in sent:
        assert_exact(GenerationRequest, message)


async def test_cancel_stops_audio_and_events() -> None:
    async with FakeCartesiaServer(CartesiaOptions(pace=1.0)) as fake:
        tts = CartesiaTts(config(fake))
        stream = await tts.open("item-1")
        await stream.push("A long sentence that takes well over a second to speak out loud. ")
        first = await until(stream.events(), TtsAudio)
        await stream.cancel()
        rest = await drain(stream.events(), within_s=2)
        await fake.server.wait_until(lambda: fake.record(1).received[-1] == {"context_id": "item-1", "cancel": True})
        again = await tts.open("item-2")  # the socket serves the next item
        await again.push("Next. ")
        await again.flush()
        after = await drain(again.events())
        await tts.aclose()
    assert len(first) == 1 and rest == []
    assert isinstance(after[-1], TtsDone)
    record = fake.record(1)
    cancel_at = record.timeline.index(("in", len(record.received) - 3))
    late = [record.sent[i] for kind, i in record.timeline[cancel_at + 1 :] if kind == "out"]
    assert [m for m in late if m["context_id"] == "item-1"] == []


async def test_bad_key_fails_the_stream_not_retryable() -> None:
    async with FakeCartesiaServer(api_key="right") as fake:
        tts = CartesiaTts(CartesiaConfig(url=fake.url, api_key="wrong", voice="v"))
        stream = await tts.open("item-1")
        (failed,) = await drain(stream.events())
        await tts.aclose()
    assert isinstance(failed, TtsFailed) and not failed.retryable
    assert "401" in failed.message


async def test_malformed_frame_is_counted_and_fails_the_stream() -> None:
    async with FakeCartesiaServer(CartesiaOptions(pace=0), faults=Faults(bad_frame_after=1)) as fake:
        tts = CartesiaTts(config(fake))
        stream = await tts.open("item-1")
        await stream.push("Hello there. ")
        events = await drain(stream.events())
        assert tts.malformed_frames == 1
        assert isinstance(events[-1], TtsFailed) and events[-1].retryable
        assert "malformed" in events[-1].message
        # The socket is still usable for the next item.
        stream = await tts.open("item-2")
        await stream.push("Again. ")
        await stream.flush()
        assert isinstance((await drain(stream.events()))[-1], TtsDone)
        await tts.aclose()


async def test_dropped_socket_fails_live_streams_and_the_next_open_reconnects() -> None:
    async with FakeCartesiaServer(
        CartesiaOptions(pace=1.0), faults=Faults(drop_after_s=0.3, fault_connections=1)
    ) as fake:
        tts = CartesiaTts(config(fake))
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
    assert orjson.loads(orjson.dumps(fake.record(2).received[0]))["context_id"] == "item-2"


async def test_a_refused_handshake_says_whether_to_retry() -> None:
    async with FakeCartesiaServer(faults=Faults(reject_status=503)) as fake:
        tts = CartesiaTts(config(fake))
        (unavailable,) = await drain((await tts.open("item-1")).events())
        await tts.aclose()
    async with FakeCartesiaServer(faults=Faults(reject_status=403)) as fake:
        tts = CartesiaTts(config(fake))
        (forbidden,) = await drain((await tts.open("item-1")).events())
        await tts.aclose()
    assert isinstance(unavailable, TtsFailed) and unavailable.retryable and "503" in unavailable.message
    assert isinstance(forbidden, TtsFailed) and not forbidden.retryable and "403" in forbidden.message
