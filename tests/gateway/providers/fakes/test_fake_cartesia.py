"""The fake Cartesia websocket, proven by the cartesia SDK's own async client and response models."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import numpy as np
import pytest
from cartesia import AsyncCartesia
from cartesia.types.websocket_response import Chunk, Done, Error, FlushDone, Timestamps, WebsocketResponse
from pydantic import TypeAdapter

from gateway.providers.fakes import speech
from gateway.providers.fakes.fake_cartesia import CartesiaOptions, FakeCartesiaServer
from tests.gateway.providers.pipeline.cloud.helpers import assert_exact

pytestmark = pytest.mark.timeout(30)

RESPONSES: TypeAdapter[Any] = TypeAdapter(WebsocketResponse)
FORMAT = {"container": "raw", "encoding": "pcm_s16le", "sample_rate": 24000}
VOICE = {"mode": "id", "id": "voice-1"}


def assert_valid_server_message(message: dict[str, Any]) -> Any:
    """The SDK's discriminated union parses it, and its model holds exactly the keys the fake sent."""
    return assert_exact(RESPONSES, message)


async def test_sdk_context_receives_audio_timestamps_done_in_order() -> None:
    text = "Hello there, this is a test."
    async with FakeCartesiaServer(CartesiaOptions(pace=0), api_key="sk-test") as fake:
        client = AsyncCartesia(api_key="sk-test", websocket_base_url=fake.base_url)
        async with client.tts.websocket_connect(websocket_connection_options={"compression": None}) as conn:
            ctx = conn.context(model_id="sonic-3", voice=VOICE, output_format=FORMAT, add_timestamps=True)
            await ctx.push(text[:12])
            await ctx.push(text[12:], flush=True)
            await ctx.no_more_inputs()
            events = []
            async with asyncio.timeout(10):
                async for event in ctx.receive():
                    events.append(event)
        await client.close()
    audio = b"".join(e.audio or b"" for e in events if isinstance(e, Chunk))
    words: list[str] = []
    starts: list[float] = []
    for e in events:
        if isinstance(e, Timestamps) and e.word_timestamps is not None:
            words += e.word_timestamps.words
            starts += e.word_timestamps.start
    assert isinstance(events[-1], Done)
    assert any(isinstance(e, FlushDone) and e.flush_id == 1 for e in events)
    assert words == text.split()
    first, first_words = speech.render(text[:12])
    second, second_words = speech.render(text[12:], lead_ms=0)
    assert audio == first + second  # the context's audio continues where the first request's ended
    offset = len(first) // 48
    expected = [w.start_ms for w in first_words] + [offset + w.start_ms for w in second_words]
    assert [round(s * 1000) for s in starts] == expected
    record = fake.record(1)
    assert record.headers["authorization"] == "Bearer sk-test"
    assert record.headers["cartesia-version"] == "2026-08-14"
    for message in record.sent:
        assert_valid_server_message(message)


async def test_timestamps_point_at_the_words_in_the_audio() -> None:
    text = "One, two three."
    pcm, words = speech.render(text)
    samples = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    for word in words:
        inside = samples[word.start_ms * 24 : word.end_ms * 24]
        assert np.sqrt(np.mean(inside**2)) > 1000  # loud inside each word
    for before, after in itertools.pairwise(words):
        gap = samples[before.end_ms * 24 : after.start_ms * 24]
        assert not gap.any()  # silent between words


async def test_bad_key_refused_401_and_bad_request_answered_with_error() -> None:
    async with FakeCartesiaServer(api_key="right") as fake:
        client = AsyncCartesia(api_key="wrong", websocket_base_url=fake.base_url)
        with pytest.raises(Exception, match="401"):
            async with client.tts.websocket_connect() as _:
                pass
        good = AsyncCartesia(api_key="right", websocket_base_url=fake.base_url)
        async with good.tts.websocket_connect() as conn:
            await conn.send(
                {
                    "context_id": "c1",
                    "model_id": "sonic-3",
                    "transcript": "hi",
                    "voice": VOICE,
                    "output_format": {"container": "raw", "encoding": "opus", "sample_rate": 24000},
                }
            )
            async with asyncio.timeout(5):
                event = await conn.recv()
        await client.close()
        await good.close()
    assert isinstance(event, Error)
    assert event.status_code == 400
    assert "encoding" in (event.message or "")


async def test_cancel_stops_the_context_audio() -> None:
    async with FakeCartesiaServer(CartesiaOptions(pace=1.0)) as fake:
        client = AsyncCartesia(api_key="k", websocket_base_url=fake.base_url)
        async with client.tts.websocket_connect() as conn:
            first = conn.context("c1", model_id="sonic-3", voice=VOICE, output_format=FORMAT)
            await first.push("A long sentence that takes well over a second to speak out loud.")
            await fake.server.wait_until(lambda: len(fake.record(1).sent) >= 2)
            await first.cancel()
            second = conn.context("c2", model_id="sonic-3", voice=VOICE, output_format=FORMAT)
            await second.push("Short.", continue_=False)
            async with asyncio.timeout(10):
                kinds = [e.type async for e in second.receive()]
        await client.close()
    assert kinds[-1] == "done"
    record = fake.record(1)
    cancel_at = record.timeline.index(("in", 1))
    after = [record.sent[i] for kind, i in record.timeline[cancel_at:] if kind == "out"]
    # Nothing of c1 went out once its cancel arrived, though c2's whole reply (~0.4 s paced) did.
    assert [m["context_id"] for m in after if m["context_id"] == "c1"] == []
    assert sum(len(m["data"]) for m in after if m["type"] == "chunk") > 0
