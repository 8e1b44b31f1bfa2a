"""The fake ElevenLabs websocket, proven by the elevenlabs SDK's own client (over TLS, as it insists on wss)
and its message models."""

from __future__ import annotations

import asyncio
import functools
import ssl
from pathlib import Path

import elevenlabs.realtime_tts
import orjson
import pybase64
import pytest
import websockets.sync.client
from elevenlabs.client import ElevenLabs
from elevenlabs.types.audio_output import AudioOutput
from elevenlabs.types.audio_output_multi import AudioOutputMulti
from elevenlabs.types.final_output import FinalOutput
from elevenlabs.types.final_output_multi import FinalOutputMulti
from websockets.asyncio.client import connect
from websockets.exceptions import InvalidStatus

from gateway.providers.fakes import speech
from gateway.providers.fakes.fake_elevenlabs import ElevenLabsOptions, FakeElevenLabsServer
from gateway.transport.self_signed import ensure_self_signed
from tests.gateway.providers.pipeline.cloud.helpers import assert_exact

pytestmark = pytest.mark.timeout(30)


# The SDK reads ConnectionClosed.code, which websockets 17 deprecates.
@pytest.mark.filterwarnings("ignore:ConnectionClosed.code is deprecated:DeprecationWarning")
@pytest.mark.timeout(60)
async def test_sdk_convert_realtime_streams_pcm_from_the_fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pair = ensure_self_signed(tmp_path, ("127.0.0.1",))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(pair.cert_file, pair.key_file)
    monkeypatch.setenv("SSL_CERT_FILE", str(pair.cert_file))  # the SDK's client trusts the fake's certificate
    # The SDK opens with websockets' default 10 s handshake timeout, which a CI run's parallel tier outlasted
    # (TLS in a thread, both cores busy); the deadline below still bounds the whole exchange.
    slow_open = functools.partial(websockets.sync.client.connect, open_timeout=20)
    monkeypatch.setattr(elevenlabs.realtime_tts, "connect", slow_open)
    chunks = ["Hello there, ", "this is the fake ", "speaking."]
    async with FakeElevenLabsServer(ElevenLabsOptions(pace=0), api_key="xi-test", ssl_context=context) as fake:
        client = ElevenLabs(api_key="xi-test", base_url=f"https://127.0.0.1:{fake.server.port}")

        def speak() -> bytes:
            stream = client.text_to_speech.convert_realtime(
                "voice-1", text=iter(chunks), model_id="eleven_flash_v2_5", output_format="pcm_24000"
            )
            return b"".join(stream)

        audio = await asyncio.wait_for(asyncio.to_thread(speak), 40)
    record = fake.record(1)
    assert record.path.startswith("/v1/text-to-speech/voice-1/stream-input?")
    assert record.query == {"model_id": "eleven_flash_v2_5", "output_format": "pcm_24000"}
    assert record.headers["xi-api-key"] == "xi-test"
    assert record.received[-1] == {"text": ""}
    assert record.close_code == 1000
    # The SDK's text_chunker re-splits the text; all of it was spoken, as one generation per trigger.
    spoken = "".join("".join(m["alignment"]["chars"]) for m in record.sent if "audio" in m)
    assert "".join(spoken.split()) == "".join("".join(chunks).split())
    assert len(audio) == sum(len(pybase64.b64decode(m["audio"])) for m in record.sent if "audio" in m)
    for message in record.sent[:-1]:
        assert_exact(AudioOutput, message)
    assert_exact(FinalOutput, record.sent[-1])


async def test_multi_context_alignment_is_relative_to_each_chunk_and_exact() -> None:
    text = "Sure, your order shipped yesterday. "
    async with FakeElevenLabsServer(ElevenLabsOptions(pace=0, chunk_ms=100), api_key="k") as fake:
        url = f"{fake.base_url}/v1/text-to-speech/v1/multi-stream-input?model_id=m&output_format=pcm_24000"
        async with connect(url, additional_headers={"xi-api-key": "k"}) as ws:
            await ws.send('{"text": " ", "context_id": "a"}')
            await ws.send('{"text": "' + text + '", "context_id": "a", "flush": true}')
            await ws.send('{"context_id": "a", "close_context": true}')
            async with asyncio.timeout(10):
                async for raw in ws:
                    if "isFinal" in orjson.loads(raw):
                        break
    sent = fake.record(1).sent
    for message in sent[:-1]:
        assert_exact(AudioOutputMulti, message)
    assert_exact(FinalOutputMulti, sent[-1])
    assert sent[-1] == {"isFinal": True, "contextId": "a"}
    _, words = speech.render(text)
    # Each character's absolute time = audio before its chunk + its chunk-relative start.
    offset = 0
    absolute: list[int] = []
    chars = ""
    for message in sent[:-1]:
        align = message["alignment"]
        absolute += [offset + s for s in align["charStartTimesMs"]]
        chars += "".join(align["chars"])
        offset += len(pybase64.b64decode(message["audio"])) // 48
    assert chars == text
    assert [absolute[w.char_start] for w in words] == [w.start_ms for w in words]
    # "yesterday." spans two 100 ms chunks: its letters are split across messages.
    split = [w for w in words if w.start_ms // 100 != (w.end_ms - 1) // 100]
    assert split


async def test_bad_key_refused_and_idle_socket_closed() -> None:
    async with FakeElevenLabsServer(api_key="right") as fake:
        url = f"{fake.base_url}/v1/text-to-speech/v/multi-stream-input?output_format=pcm_24000&inactivity_timeout=0.3"
        with pytest.raises(InvalidStatus) as refused:
            async with connect(url, additional_headers={"xi-api-key": "wrong"}):
                pass
        assert refused.value.response.status_code == 401
        async with connect(url, additional_headers={"xi-api-key": "right"}) as ws:
            await ws.send('{"text": " ", "context_id": "a"}')
            async with asyncio.timeout(5):
                await ws.wait_closed()
        assert ws.close_code == 1008
