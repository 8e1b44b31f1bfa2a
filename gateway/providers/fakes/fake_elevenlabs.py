"""A local ElevenLabs streaming TTS websocket for tests and load: multi-context and single-context stream input.

Paths (the ``elevenlabs`` SDK 2.x, ``realtime_tts.py`` and the ``v_1_text_to_speech_voice_id_*`` message types):

- ``/v1/text-to-speech/{voice_id}/multi-stream-input?model_id=..&output_format=pcm_24000[&auto_mode=true]
  [&inactivity_timeout=20]``: ``InitialiseContext`` (``text: " "`` and a ``context_id``), ``SendTextMulti``
  (``flush`` generates the context's buffered text now), ``FlushContext``, ``KeepContextAlive`` (``text: ""``),
  ``CloseContext`` (buffered, unflushed text is dropped; audio already being generated goes on, then
  ``isFinal``), ``CloseSocket``. Answers carry ``contextId``: ``{audio, alignment, normalizedAlignment,
  contextId}`` and ``{isFinal: true, contextId}``.
- ``/v1/text-to-speech/{voice_id}/stream-input``: one implicit context; ``text: ""`` ends the input, the rest is
  generated, ``isFinal`` sent and the socket closed with 1000 (what the SDK's ``convert_realtime`` reads).

Text is generated when ``flush`` asks, when the buffer reaches the first ``chunk_length_schedule`` length (120
characters unless the client's ``generation_config`` says otherwise), or at each sentence end with
``auto_mode=true``. Audio (:mod:`gateway.providers.fakes.speech`, PCM16 at the ``output_format`` rate) goes out in
``chunk_ms`` pieces at ``pace`` x real time; each piece's alignment lists the characters whose sound starts in it,
with times relative to that piece, as the service documents ("relative to the returned chunk"). A word may
therefore start in one piece and end in the next. No message for ``inactivity_timeout`` seconds (default 20)
closes the socket with 1008. A handshake without the ``xi-api-key`` header the server was given is refused with
401; faults and records: :mod:`gateway.providers.fakes.vendor_server`.
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Any

import pybase64

from gateway.providers.fakes import speech
from gateway.providers.fakes.vendor_server import FakeLink, Faults, VendorRecord, VendorServer, with_query

_PATH = re.compile(r"^/v1/text-to-speech/(?P<voice>[^/?]+)/(?P<kind>multi-stream-input|stream-input)(?:\?|$)")
_RATES = {f"pcm_{rate}": rate for rate in (8000, 16000, 22050, 24000, 44100, 48000)}
DEFAULT_SCHEDULE = 120
SINGLE = "__single__"


@dataclass(frozen=True, slots=True, kw_only=True)
class ElevenLabsOptions:
    chunk_ms: int = 100
    pace: float = 1.0  # 1.0: audio goes out in real time; 0: all at once

    def __post_init__(self) -> None:
        if self.chunk_ms <= 0 or self.pace < 0:
            raise ValueError("chunk_ms must be positive and pace non-negative")


@dataclass(slots=True)
class _Context:
    context_id: str
    schedule: int = DEFAULT_SCHEDULE
    buffer: str = ""
    jobs: asyncio.Queue[str | None] = field(default_factory=asyncio.Queue)  # text to generate; None: finish
    task: asyncio.Task[None] | None = None
    audio_ms: int = 0
    closing: bool = False


class FakeElevenLabsServer:
    """``async with FakeElevenLabsServer() as fake``; point a client at :attr:`base_url` (``/v1/...``)."""

    def __init__(
        self,
        options: ElevenLabsOptions | None = None,
        *,
        faults: Faults | None = None,
        api_key: str | None = None,
        ssl_context: Any = None,
        port: int = 0,
        keep_messages: bool = True,
    ) -> None:
        self.options = options or ElevenLabsOptions()
        auth = None if api_key is None else (lambda h, q: h.get("xi-api-key", "") == api_key)
        self.server = VendorServer(
            self._serve, faults=faults, auth=auth, ssl_context=ssl_context, port=port, keep_messages=keep_messages
        )

    @property
    def base_url(self) -> str:
        scheme = "wss" if self.server.ssl_context is not None else "ws"
        return f"{scheme}://127.0.0.1:{self.server.port}"

    def record(self, conn_id: int) -> VendorRecord:
        return self.server.record(conn_id)

    async def __aenter__(self) -> FakeElevenLabsServer:
        await self.server.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.server.aclose()

    async def _serve(self, link: FakeLink) -> None:
        match = _PATH.match(link.record.path)
        rate = _RATES.get(link.query.get("output_format", ""))
        if match is None or rate is None:
            problem = (
                "unknown path" if match is None else f"unsupported output_format {link.query.get('output_format')}"
            )
            await link.send({"message": problem, "error": "invalid_request", "code": 1008})
            await link.close(1008, problem[:120])
            return
        options = with_query(self.options, link.query)
        multi = match.group("kind") == "multi-stream-input"
        auto_mode = link.query.get("auto_mode", "false").lower() == "true"
        idle_s = float(link.query.get("inactivity_timeout", "20"))
        session = _Session(link, options, rate, multi=multi, auto_mode=auto_mode)
        messages = link.messages()
        try:
            while True:
                try:
                    async with asyncio.timeout(idle_s):
                        message = await anext(messages)
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    await link.close(1008, "Have not received a new text input within the timeout")
                    return
                if isinstance(message, bytes) or "__malformed__" in message:
                    await link.send({"message": "expected a JSON text message", "error": "invalid_request"})
                    continue
                if await session.on_message(message):
                    return
        finally:
            await messages.aclose()


class _Session:
    def __init__(self, link: FakeLink, options: ElevenLabsOptions, rate: int, *, multi: bool, auto_mode: bool):
        self.link = link
        self.options = options
        self.rate = rate
        self.multi = multi
        self.auto_mode = auto_mode
        self.contexts: dict[str, _Context] = {}

    async def on_message(self, message: dict[str, Any]) -> bool:
        """Handle one client message; True when the socket is done."""
        if message.get("close_socket") is True:
            await self._finish_all()
            await self.link.close(1000, "")
            return True
        context_id = str(message.get("context_id") or "default") if self.multi else SINGLE
        if self.multi and message.get("close_context") is True:
            context = self.contexts.get(context_id)
            if context is not None:
                context.buffer = ""
                context.closing = True
                context.jobs.put_nowait(None)
            return False
        text = message.get("text")
        if not isinstance(text, str) and not message.get("flush"):
            await self.link.send({"message": "text must be a string", "error": "invalid_request"})
            return False
        context = self.contexts.get(context_id)
        if context is None:
            context = self.contexts[context_id] = _Context(context_id)
            context.task = self.link.spawn(self._generate(context), f"context-{context_id}")
        config = message.get("generation_config")
        if isinstance(config, dict) and config.get("chunk_length_schedule"):
            context.schedule = int(config["chunk_length_schedule"][0])
        if not self.multi and text == "":
            self._take(context, context.buffer)
            context.jobs.put_nowait(None)  # end of input: isFinal then close
            assert context.task is not None
            await context.task
            await self.link.close(1000, "")
            return True
        context.buffer += (text or "").lstrip() if not context.buffer else (text or "")
        if message.get("flush"):
            self._take(context, context.buffer)
        elif self.auto_mode:
            end = max(context.buffer.rfind(p) for p in (". ", "? ", "! "))
            if end >= 0:
                self._take(context, context.buffer[: end + 2])
        elif len(context.buffer) >= context.schedule:
            cut = context.buffer.rfind(" ") + 1
            if cut > 0:
                self._take(context, context.buffer[:cut])
        return False

    def _take(self, context: _Context, text: str) -> None:
        context.buffer = context.buffer[len(text) :]
        if text.strip():
            context.jobs.put_nowait(text)

    async def _finish_all(self) -> None:
        for context in list(self.contexts.values()):
            self._take(context, context.buffer)
            context.jobs.put_nowait(None)
        for context in list(self.contexts.values()):
            if context.task is not None:
                await context.task

    async def _generate(self, context: _Context) -> None:
        started = time.monotonic()
        while True:
            text = await context.jobs.get()
            if text is None:
                break
            await self._speak(context, text, started)
        final: dict[str, Any] = {"isFinal": True}
        if self.multi:
            final["contextId"] = context.context_id
        await self.link.send(final)
        self.contexts.pop(context.context_id, None)

    async def _speak(self, context: _Context, text: str, started: float) -> None:
        rate = self.rate
        lead = speech.LEAD_MS if context.audio_ms == 0 else 0
        pcm, words = speech.render(text, sample_rate=rate, lead_ms=lead)
        total_ms = len(pcm) * 1000 // (2 * rate)
        times = speech.char_times(text, words, total_ms)
        chunk_ms = self.options.chunk_ms
        step = rate * chunk_ms // 1000 * 2
        placed = 0  # characters already aligned
        for index, first in enumerate(range(0, len(pcm), step)):
            piece = pcm[first : first + step]
            piece_start = index * chunk_ms
            piece_end = piece_start + len(piece) * 1000 // (2 * rate)
            last = index == (len(pcm) - 1) // step
            chars, starts, durations = [], [], []
            while placed < len(text) and (last or times[placed][0] < piece_end):
                start, duration = times[placed]
                chars.append(text[placed])
                starts.append(start - piece_start)
                durations.append(duration)
                placed += 1
            if self.options.pace:
                delay = started + (context.audio_ms / 1000) / self.options.pace - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            alignment = {"chars": chars, "charStartTimesMs": starts, "charDurationsMs": durations}
            message: dict[str, Any] = {
                "audio": pybase64.b64encode(piece).decode(),
                "alignment": alignment,
                "normalizedAlignment": dict(alignment),
            }
            if self.multi:
                message["contextId"] = context.context_id
            await self.link.send(message)
            context.audio_ms += piece_end - piece_start
