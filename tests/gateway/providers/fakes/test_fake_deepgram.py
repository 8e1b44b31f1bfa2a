"""The fake Deepgram live STT, proven by the deepgram SDK's own async websocket client and response models."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from deepgram import AsyncDeepgramClient
from deepgram.core.api_error import ApiError
from deepgram.environment import DeepgramClientEnvironment
from deepgram.listen.v1.types import (
    ListenV1Metadata,
    ListenV1Results,
    ListenV1SpeechStarted,
    ListenV1UtteranceEnd,
)
from websockets.asyncio.client import connect

from gateway.providers.fakes import speech
from gateway.providers.fakes.fake_deepgram import DeepgramOptions, FakeDeepgramServer
from tests.gateway.providers.pipeline.cloud.helpers import assert_exact

pytestmark = [
    pytest.mark.timeout(30),
    # The SDK connects through websockets' legacy client, which websockets 17 deprecates.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

MODELS: dict[str, Any] = {
    "Results": ListenV1Results,
    "SpeechStarted": ListenV1SpeechStarted,
    "UtteranceEnd": ListenV1UtteranceEnd,
    "Metadata": ListenV1Metadata,
}


def utterance_16k(text: str = "Hello there, my order.") -> bytes:
    pcm, _ = speech.render(text, sample_rate=16_000)
    return pcm


def silence_16k(ms: int) -> bytes:
    return b"\0" * (32 * ms)


def environment(base_url: str) -> DeepgramClientEnvironment:
    return DeepgramClientEnvironment(
        base="http://unused", production=base_url, agent="ws://unused", agent_rest="http://unused"
    )


async def test_sdk_client_gets_speech_started_interims_final_utterance_end_metadata() -> None:
    options = DeepgramOptions(transcripts=("my order number is four five",), interim_ms=400)
    async with FakeDeepgramServer(options, api_key="dg-test") as fake:
        client = AsyncDeepgramClient(api_key="dg-test", environment=environment(fake.base_url))
        received: list[Any] = []
        async with client.listen.v1.connect(
            model="nova-3",
            encoding="linear16",
            sample_rate=16000,
            interim_results="true",
            endpointing=300,
            utterance_end_ms=1000,
            vad_events="true",
        ) as socket:
            audio = silence_16k(200) + utterance_16k("Hello there, my order number is four five.") + silence_16k(1500)
            for first in range(0, len(audio), 640):
                await socket.send_media(audio[first : first + 640])
            await socket.send_keep_alive()
            await socket.send_close_stream()
            async with asyncio.timeout(10):
                async for message in socket:
                    received.append(message)
    kinds = [type(m).__name__ for m in received]
    assert kinds[0] == "ListenV1SpeechStarted" and kinds[-1] == "ListenV1Metadata"
    assert isinstance(received[0], ListenV1SpeechStarted) and received[0].timestamp == pytest.approx(0.22)
    finals = [
        m for m in received if isinstance(m, ListenV1Results) and m.is_final and m.channel.alternatives[0].transcript
    ]
    assert [f.channel.alternatives[0].transcript for f in finals] == ["my order number is four five"]
    assert finals[0].speech_final is True
    interims = [m for m in received if isinstance(m, ListenV1Results) and not m.is_final]
    counts = [len(i.channel.alternatives[0].words) for i in interims]
    assert counts[0] < 6 and counts == sorted(counts)  # interims reveal the words as they are heard
    ends = [m for m in received if isinstance(m, ListenV1UtteranceEnd)]
    assert len(ends) == 1 and ends[0].last_word_end == finals[0].channel.alternatives[0].words[-1].end
    record = fake.record(1)
    assert record.headers["authorization"] == "Token dg-test"
    assert record.query["encoding"] == "linear16" and record.query["vad_events"] == "true"
    assert bytes(record.audio) == audio
    assert record.received_types() == ["KeepAlive", "CloseStream"]
    assert record.close_code == 1000
    for message in record.sent:
        assert_exact(MODELS[message["type"]], message)


async def test_finalize_answers_from_finalize_and_bad_requests_are_refused() -> None:
    async with FakeDeepgramServer(DeepgramOptions(transcripts=("yes please",)), api_key="dg") as fake:
        bad_key = AsyncDeepgramClient(api_key="nope", environment=environment(fake.base_url))
        with pytest.raises(ApiError) as refused:
            async with bad_key.listen.v1.connect(model="nova-3"):
                pass
        assert refused.value.status_code == 401
        with pytest.raises(ApiError) as bad:
            async with AsyncDeepgramClient(api_key="dg", environment=environment(fake.base_url)).listen.v1.connect(
                model="nova-3", encoding="mulaw", sample_rate=16000
            ):
                pass
        assert bad.value.status_code == 400
        client = AsyncDeepgramClient(api_key="dg", environment=environment(fake.base_url))
        async with client.listen.v1.connect(
            model="nova-3", encoding="linear16", sample_rate=16000, endpointing="false"
        ) as socket:
            await socket.send_media(utterance_16k("Yes please.") + silence_16k(100))
            await socket.send_finalize()
            async with asyncio.timeout(5):
                while True:
                    message = await socket.recv()
                    if isinstance(message, ListenV1Results) and message.from_finalize:
                        break
    assert message.channel.alternatives[0].transcript == "yes please"
    assert message.is_final is True and message.speech_final is False


async def test_idle_connection_closed_net0001() -> None:
    async with (
        FakeDeepgramServer(DeepgramOptions(idle_timeout_s=0.3)) as fake,
        connect(fake.url + "?encoding=mulaw&sample_rate=8000") as ws,
        asyncio.timeout(5),
    ):
        await ws.wait_closed()
    assert ws.close_code == 1011 and ws.close_reason.startswith("NET-0001")


async def test_http_records_and_control_on_the_same_port() -> None:
    async with FakeDeepgramServer() as fake, connect(fake.url + "?encoding=linear16&sample_rate=16000") as ws:
        await ws.send(silence_16k(100))
        await ws.send('{"type": "KeepAlive"}')
        await fake.server.wait_until(lambda: fake.record(1).received_count == 1)
        base = f"http://127.0.0.1:{fake.server.port}"
        async with httpx.AsyncClient(base_url=base, trust_env=False, timeout=5) as http:
            assert (await http.get("/healthz")).json() == {"ok": True, "live": 1}
            (summary,) = (await http.get("/records")).json()
            assert (summary["audio_bytes"], summary["received"]) == (3200, 1)
            assert (await http.get("/records/1")).json()["received_list"] == [{"type": "KeepAlive"}]
            assert (await http.get("/records/9")).status_code == 404
            assert (await http.get("/control/1?action=explode")).status_code == 400
            assert (await http.get("/control/1?action=drop")).json() == {"ok": True, "connection": 1}
        async with asyncio.timeout(5):
            await ws.wait_closed()
    assert ws.close_code == 1006  # dropped without a close frame
