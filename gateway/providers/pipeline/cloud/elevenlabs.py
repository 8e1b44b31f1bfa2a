"""ElevenLabs TTS over its multi-context websocket (``multi-stream-input``), one context per assistant item.

Protocol (the ``elevenlabs`` SDK 2.x message types ``InitialiseContext``, ``SendTextMulti``, ``KeepContextAlive``,
``CloseContext``, ``CloseSocket``, ``AudioOutputMulti``, ``FinalOutputMulti``):

- connect ``wss://api.elevenlabs.io/v1/text-to-speech/{voice}/multi-stream-input?model_id=..&output_format=
  pcm_24000&auto_mode=false&inactivity_timeout=..`` with the ``xi-api-key`` header;
- :meth:`ElevenLabsStream.push` sends the clause with ``flush: true`` (the first push opens the context with
  ``InitialiseContext``), so nothing waits for the 120-character default ``chunk_length_schedule``;
  :meth:`~ElevenLabsStream.flush` closes the context, after which the server finishes the audio and says
  ``isFinal``; :meth:`~ElevenLabsStream.cancel` closes the context too and drops whatever still arrives for it
  (the service finishes audio it already started; the caller must not hear it);
- an idle context gets ``{"text": "", "context_id"}`` every ``keepalive_s`` so the server's inactivity timeout
  does not close the socket under a long LLM pause.

Word timing (:class:`ElevenAlignment`, sans-I/O): each audio message's alignment gives character start times
relative to *that* message's audio. A character's time in the item is therefore the audio already emitted by the
stream (bytes / 48 at 24 kHz) plus its relative start; the offset accumulates across every message and clause of
the item and is never reset per sentence (pipecat PR #3727). A word is emitted once its following space arrives,
so a word split across two messages is carried, not broken in two (pipecat PR #2840); ``normalizedAlignment`` is
preferred when present (pipecat #4316). Each word is then placed in the pushed text with
:func:`~gateway.providers.pipeline.cloud._words.locate`.

Faults: as :mod:`gateway.providers.pipeline.cloud.cartesia` (refused handshake, drop, malformed frame, server
``error`` message).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlencode

import orjson
import pybase64

from gateway.providers._link import cancel_and_wait
from gateway.providers.errors import ProviderError
from gateway.providers.pipeline.cloud._socket import MALFORMED, EventQueue, VendorSocket
from gateway.providers.pipeline.cloud._words import locate
from gateway.providers.pipeline.ports import TtsAudio, TtsDone, TtsEvent, TtsFailed, TtsWords, Word

log = logging.getLogger(__name__)

DEFAULT_URL = "wss://api.elevenlabs.io"
OUTPUT_FORMAT = "pcm_24000"
BYTES_PER_MS = 48  # PCM16 mono at 24 kHz


@dataclass(frozen=True, slots=True, kw_only=True)
class ElevenLabsConfig:
    """How to reach ElevenLabs. ``url`` is the API base (``/v1/...`` is appended); ``voice`` a voice id."""

    url: str = DEFAULT_URL
    api_key: str = field(default="", repr=False)
    model: str = "eleven_flash_v2_5"
    voice: str = ""
    language: str = ""  # language_code, for the multilingual models
    auto_mode: bool = False
    apply_text_normalization: str = ""  # auto | on | off; empty: the service default
    inactivity_timeout_s: int = 60
    keepalive_s: float = 10.0
    voice_settings: Mapping[str, Any] | None = None  # stability, similarity_boost, style, speed, ...
    open_timeout_s: float = 10.0
    event_queue_size: int = 512

    def __post_init__(self) -> None:
        if not 1 <= self.inactivity_timeout_s <= 180:
            raise ValueError("inactivity_timeout_s must be within 1..180")
        if self.apply_text_normalization not in ("", "auto", "on", "off"):
            raise ValueError("apply_text_normalization must be auto, on or off")
        if self.keepalive_s <= 0 or self.keepalive_s >= self.inactivity_timeout_s:
            raise ValueError("keepalive_s must be positive and below inactivity_timeout_s")


def build_url(config: ElevenLabsConfig, voice: str) -> str:
    query: dict[str, str] = {
        "model_id": config.model,
        "output_format": OUTPUT_FORMAT,
        "auto_mode": "true" if config.auto_mode else "false",
        "inactivity_timeout": str(config.inactivity_timeout_s),
    }
    if config.language:
        query["language_code"] = config.language
    if config.apply_text_normalization:
        query["apply_text_normalization"] = config.apply_text_normalization
    base = config.url.rstrip("/")
    return f"{base}/v1/text-to-speech/{quote(voice, safe='')}/multi-stream-input?{urlencode(query)}"


def headers(config: ElevenLabsConfig) -> dict[str, str]:
    return {"xi-api-key": config.api_key} if config.api_key else {}


def initialise_context(config: ElevenLabsConfig, context_id: str) -> dict[str, Any]:
    message: dict[str, Any] = {"text": " ", "context_id": context_id}
    if config.voice_settings:
        message["voice_settings"] = dict(config.voice_settings)
    return message


def send_text(context_id: str, text: str) -> dict[str, Any]:
    """A clause, flushed at once. The service wants text to end with a single space."""
    if not text[-1:].isspace():
        text += " "
    return {"text": text, "context_id": context_id, "flush": True}


def keep_context_alive(context_id: str) -> dict[str, Any]:
    return {"text": "", "context_id": context_id}


def close_context(context_id: str) -> dict[str, Any]:
    return {"context_id": context_id, "close_context": True}


CLOSE_SOCKET: Mapping[str, Any] = {"close_socket": True}


class ElevenAlignment:
    """Per-context word builder: accumulates the audio offset and carries partial words across messages."""

    def __init__(self) -> None:
        self.text = ""  # what was pushed, for char offsets
        self.audio_bytes = 0
        self._cursor = 0
        self._word = ""
        self._word_start_ms = 0
        self._word_end_ms = 0

    def pushed(self, text: str) -> None:
        self.text += text

    def feed(self, message: Mapping[str, Any]) -> list[TtsEvent]:
        """Events for one audio message. Raises ValueError/KeyError/TypeError when malformed."""
        data = message.get("audio") or ""
        pcm = pybase64.b64decode(data, validate=True) if data else b""
        if len(pcm) % 2:
            raise ValueError("odd-length PCM16 chunk")
        offset_ms = self.audio_bytes // BYTES_PER_MS
        self.audio_bytes += len(pcm)
        events: list[TtsEvent] = [TtsAudio(pcm=pcm)] if pcm else []
        alignment = message.get("normalizedAlignment") or message.get("alignment")
        if alignment:
            words = self._chars(
                alignment["chars"], alignment["charStartTimesMs"], alignment["charDurationsMs"], offset_ms
            )
            if words:
                events.append(TtsWords(words=tuple(words)))
        return events

    def finish(self) -> list[TtsEvent]:
        """The context is final: the carried word, if any, is complete."""
        word = self._take()
        return [TtsWords(words=(word,))] if word is not None else []

    def _chars(
        self, chars: Sequence[str], starts: Sequence[int], durations: Sequence[int], offset_ms: int
    ) -> list[Word]:
        if not (len(chars) == len(starts) == len(durations)):
            raise ValueError("alignment lists differ in length")
        words: list[Word] = []
        for char, start, duration in zip(chars, starts, durations):
            if not isinstance(char, str) or not _is_number(start) or not _is_number(duration):
                raise TypeError("alignment entries must be a character and two numbers of milliseconds")
            start, duration = round(start), round(duration)
            if char.isspace():
                word = self._take()
                if word is not None:
                    words.append(word)
                continue
            if not self._word:
                self._word_start_ms = offset_ms + start
            self._word += char
            self._word_end_ms = max(self._word_end_ms, offset_ms + start + duration)
        return words

    def _take(self) -> Word | None:
        if not self._word:
            return None
        char_start, char_end = locate(self.text, self._cursor, self._word)
        self._cursor = char_end
        word = Word(
            text=self._word,
            start_ms=self._word_start_ms,
            end_ms=self._word_end_ms,
            char_start=char_start,
            char_end=char_end,
        )
        self._word, self._word_end_ms = "", 0
        return word


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_terminal(event: TtsEvent) -> bool:
    return isinstance(event, TtsDone | TtsFailed)


class ElevenLabsStream:
    """One assistant item: an ElevenLabs context on the voice's socket."""

    timestamps = True

    def __init__(self, owner: _VoiceSocket, context_id: str, queue_size: int) -> None:
        self._owner = owner
        self.context_id = context_id
        self.alignment = ElevenAlignment()
        self._queue: EventQueue[TtsEvent] = EventQueue(queue_size, _is_terminal)
        self._started = False
        self._flushed = False
        self.last_sent = time.monotonic()

    @property
    def idle(self) -> bool:
        """Open on the server and waiting for text: the context a keep-alive is for."""
        return self._started and not self._flushed and not self._queue.closed

    async def push(self, text: str) -> None:
        if self._flushed or self._queue.closed or not text:
            return
        self.alignment.pushed(text)
        if not self._started:
            self._started = True
            await self._send(initialise_context(self._owner.config, self.context_id))
        await self._send(send_text(self.context_id, text))

    async def flush(self) -> None:
        if self._flushed or self._queue.closed:
            return
        self._flushed = True
        if not self._started:  # nothing was said: nothing to wait for
            self._queue.finish(TtsDone())
            self._owner.forget(self.context_id)
            return
        await self._send(close_context(self.context_id))

    async def cancel(self) -> None:
        self._queue.end()
        if self._owner.forget(self.context_id) and self._started:
            with contextlib.suppress(ProviderError):  # the socket is gone: the context went with it
                await self._owner.send(close_context(self.context_id))

    def events(self) -> AsyncIterator[TtsEvent]:
        return self._queue

    async def keep_alive(self) -> None:
        await self._send(keep_context_alive(self.context_id))

    async def _send(self, message: Mapping[str, Any]) -> None:
        self.last_sent = time.monotonic()
        try:
            await self._owner.send(message)
        except ProviderError as exc:
            self.fail(TtsFailed(message=f"elevenlabs: {exc}", retryable=exc.retryable))

    def deliver(self, message: Mapping[str, Any]) -> None:
        if message.get("isFinal"):
            for event in self.alignment.finish():
                self._queue.offer(event)
            self._queue.finish(TtsDone())
            self._owner.forget(self.context_id)
            return
        for event in self.alignment.feed(message):
            if not self._queue.offer(event):
                self.fail(TtsFailed(message="elevenlabs: event queue overflow (consumer too slow)", retryable=True))
                return

    def fail(self, event: TtsFailed) -> None:
        self._queue.finish(event)
        self._owner.forget(self.context_id)


class _VoiceSocket:
    """One websocket for one voice: routes ``contextId`` messages to streams, keeps idle contexts alive."""

    def __init__(self, tts: ElevenLabsTts, voice: str) -> None:
        self.config = tts.config
        self._tts = tts
        self._voice = voice
        self._socket: VendorSocket | None = None
        self._lock = asyncio.Lock()
        self.streams: dict[str, ElevenLabsStream] = {}
        self._keepalive_task: asyncio.Task[None] | None = None

    async def ensure(self) -> VendorSocket:
        async with self._lock:
            if self._socket is None or not self._socket.is_open:
                self._socket = await VendorSocket.connect(
                    build_url(self.config, self._voice),
                    headers(self.config),
                    name="elevenlabs",
                    on_frame=self._on_frame,
                    on_closed=self._on_closed,
                    open_timeout_s=self.config.open_timeout_s,
                )
            if self._keepalive_task is None:
                self._keepalive_task = asyncio.create_task(self._keep_alive(), name="elevenlabs-keepalive")
            return self._socket

    async def send(self, message: Mapping[str, Any]) -> None:
        socket = self._socket
        if socket is None:
            socket = await self.ensure()
        await socket.send_json(message)

    def forget(self, context_id: str) -> bool:
        return self.streams.pop(context_id, None) is not None

    async def aclose(self) -> None:
        task, self._keepalive_task = self._keepalive_task, None
        await cancel_and_wait(task)
        socket, self._socket = self._socket, None
        if socket is not None:
            with contextlib.suppress(ProviderError):
                await socket.send_json(CLOSE_SOCKET)
            await socket.aclose()
        self._fail_all(TtsFailed(message="elevenlabs: closed", retryable=False))

    async def _keep_alive(self) -> None:
        period = self.config.keepalive_s
        while True:
            await asyncio.sleep(period / 2)
            now = time.monotonic()
            for stream in list(self.streams.values()):
                if stream.idle and now - stream.last_sent >= period:
                    await stream.keep_alive()

    def _on_frame(self, raw: str | bytes) -> None:
        try:
            message = orjson.loads(raw)
            if not isinstance(message, dict):
                raise TypeError("not a JSON object")
            if "error" in message or ("message" in message and "audio" not in message):
                self._fail_all(
                    TtsFailed(message=f"elevenlabs: {message.get('message') or message.get('error')}", retryable=True)
                )
                return
            context_id = message.get("contextId")
            if not isinstance(context_id, str):
                raise ValueError("message without contextId")
            stream = self.streams.get(context_id)
            if stream is not None:  # else: a cancelled context's late audio, dropped
                stream.deliver(message)
        except MALFORMED as exc:
            self._tts.malformed_frames += 1
            log.warning("elevenlabs: malformed frame (%d so far): %r", self._tts.malformed_frames, exc)
            self._fail_all(TtsFailed(message=f"elevenlabs sent a malformed frame: {exc}", retryable=True))

    def _on_closed(self, code: int | None, reason: str) -> None:
        self._socket = None
        self._fail_all(TtsFailed(message=f"elevenlabs: connection closed (code {code}: {reason})", retryable=True))

    def _fail_all(self, event: TtsFailed) -> None:
        for stream in list(self.streams.values()):
            stream.fail(event)


class ElevenLabsTts:
    """The call's ElevenLabs connections (one per voice), opening one context per assistant item."""

    def __init__(self, config: ElevenLabsConfig) -> None:
        self.config = config
        self._sockets: dict[str, _VoiceSocket] = {}
        self._ids = itertools.count(1)
        self.malformed_frames = 0

    async def open(self, utterance_id: str, *, voice: str = "") -> ElevenLabsStream:
        voice = voice or self.config.voice
        owner = self._sockets.get(voice)
        if owner is None:
            owner = self._sockets[voice] = _VoiceSocket(self, voice)
        context_id = utterance_id if utterance_id not in owner.streams else f"{utterance_id}-{next(self._ids)}"
        stream = ElevenLabsStream(owner, context_id, self.config.event_queue_size)
        try:
            await owner.ensure()
        except ProviderError as exc:
            stream.fail(TtsFailed(message=f"elevenlabs: {exc}", retryable=exc.retryable))
            return stream
        owner.streams[context_id] = stream
        return stream

    async def aclose(self) -> None:
        sockets = list(self._sockets.values())
        self._sockets.clear()
        for owner in sockets:
            await owner.aclose()
