"""OpenAI-compatible TTS over HTTP (``POST {base}/audio/speech``), raw 24 kHz PCM streamed, no word timestamps.

The generic dialect: OpenAI itself, and the servers that copy its ``/v1/audio/speech`` (Kokoro servers,
OpenRouter, Ollama). The request is the ``openai`` SDK's ``SpeechCreateParams`` with ``response_format: "pcm"``
(24 kHz mono PCM16, the pipeline's rate); the body of the answer is the audio itself, read as it arrives.

The HTTP dialect takes whole texts, not a stream of them: each :meth:`OpenAISpeechStream.push` becomes one
request, spoken in order by the stream's one worker task, so the first clause plays while the LLM writes the
next. There are no word timestamps (``timestamps = False``): the pipeline estimates them from each clause's
audio. :meth:`~OpenAISpeechStream.cancel` cancels the worker, which closes the response being read.

Errors: an HTTP error status becomes :class:`TtsFailed` with the server's message; 401/403 and other 4xx
except 408/429 are not retryable. A connection lost mid-answer is retryable.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from gateway.providers._link import cancel_and_wait, is_loopback_url
from gateway.providers.pipeline.cloud._socket import EventQueue
from gateway.providers.pipeline.ports import TtsAudio, TtsDone, TtsEvent, TtsFailed

DEFAULT_URL = "https://api.openai.com/v1"


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenAISpeechConfig:
    """Where and how to synthesise. ``url`` is the API base (``/audio/speech`` is appended)."""

    url: str = DEFAULT_URL
    api_key: str = field(default="", repr=False)
    model: str = "gpt-4o-mini-tts"
    voice: str = "marin"
    instructions: str = ""  # speaking style, for the models that take it
    speed: float | None = None
    timeout_s: float = 30.0
    event_queue_size: int = 512

    def __post_init__(self) -> None:
        if self.speed is not None and not 0.25 <= self.speed <= 4.0:
            raise ValueError("speed must be within 0.25..4.0")


def speech_request(config: OpenAISpeechConfig, text: str, voice: str = "") -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": config.model,
        "input": text,
        "voice": voice or config.voice,
        "response_format": "pcm",
    }
    if config.instructions:
        body["instructions"] = config.instructions
    if config.speed is not None:
        body["speed"] = config.speed
    return body


def failure_of(status: int, body: bytes) -> TtsFailed:
    """The failure an HTTP error answer means, with the server's own message when it gave one."""
    detail = body[:200].decode("utf-8", "replace")
    try:
        parsed = orjson.loads(body)
        if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
            detail = str(parsed["error"].get("message") or detail)
    except orjson.JSONDecodeError:
        pass
    retryable = status >= 500 or status in (408, 429)
    return TtsFailed(message=f"openai speech: HTTP {status}: {detail}", retryable=retryable)


class PcmFramer:
    """HTTP chunks to whole PCM16 samples: an odd byte waits for the next chunk."""

    def __init__(self) -> None:
        self._carry = b""

    def feed(self, data: bytes) -> bytes:
        data = self._carry + data
        cut = len(data) - len(data) % 2
        self._carry = data[cut:]
        return data[:cut]


def _is_terminal(event: TtsEvent) -> bool:
    return isinstance(event, TtsDone | TtsFailed)


class OpenAISpeechStream:
    """One assistant item: its clauses, synthesised one request after another."""

    timestamps = False

    def __init__(self, owner: OpenAISpeechTts, voice: str) -> None:
        self._owner = owner
        self._voice = voice
        self._queue: EventQueue[TtsEvent] = EventQueue(owner.config.event_queue_size, _is_terminal)
        self._texts: asyncio.Queue[str | None] = asyncio.Queue()
        self._flushed = False
        self._task = asyncio.create_task(self._speak_all(), name="openai-speech")

    async def push(self, text: str) -> None:
        if not self._flushed and text.strip():
            self._texts.put_nowait(text)

    async def flush(self) -> None:
        if not self._flushed:
            self._flushed = True
            self._texts.put_nowait(None)

    async def cancel(self) -> None:
        self._queue.end()
        await cancel_and_wait(self._task)

    def events(self) -> AsyncIterator[TtsEvent]:
        return self._queue

    @property
    def finished(self) -> bool:
        return self._task.done()

    async def _speak_all(self) -> None:
        while (text := await self._texts.get()) is not None:
            failure = await self._speak(text)
            if failure is not None:
                self._queue.finish(failure)
                return
        self._queue.finish(TtsDone())

    async def _speak(self, text: str) -> TtsFailed | None:
        config = self._owner.config
        framer = PcmFramer()
        try:
            async with self._owner.client.stream(
                "POST", "/audio/speech", json=speech_request(config, text, self._voice)
            ) as response:
                if response.status_code != 200:
                    return failure_of(response.status_code, await response.aread())
                async for chunk in response.aiter_bytes():
                    pcm = framer.feed(chunk)
                    if pcm and not self._queue.offer(TtsAudio(pcm=pcm)):
                        return TtsFailed(message="openai speech: event queue overflow", retryable=True)
        except httpx.HTTPError as exc:
            return TtsFailed(message=f"openai speech: {type(exc).__name__}: {exc}", retryable=True)
        return None


class OpenAISpeechTts:
    """The call's speech client: one httpx connection pool, one stream per assistant item."""

    def __init__(self, config: OpenAISpeechConfig) -> None:
        self.config = config
        headers: Mapping[str, str] = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        self.client = httpx.AsyncClient(
            base_url=config.url.rstrip("/"),
            headers=dict(headers),
            timeout=httpx.Timeout(config.timeout_s, connect=min(config.timeout_s, 10.0)),
            trust_env=not is_loopback_url(config.url),
        )
        self._streams: list[OpenAISpeechStream] = []

    async def open(self, utterance_id: str, *, voice: str = "") -> OpenAISpeechStream:
        self._streams = [s for s in self._streams if not s.finished]
        stream = OpenAISpeechStream(self, voice or self.config.voice)
        self._streams.append(stream)
        return stream

    async def aclose(self) -> None:
        for stream in self._streams:
            await stream.cancel()
        self._streams.clear()
        await self.client.aclose()
