"""Cartesia TTS over its websocket (``/tts/websocket``), one context per assistant item, word timestamps on.

Protocol (the ``cartesia`` SDK 4.x, ``types/generation_request.py``, ``types/websocket_response.py``):

- connect ``wss://api.cartesia.ai/tts/websocket`` with ``Authorization: Bearer <key>`` and ``Cartesia-Version``;
- each :meth:`CartesiaStream.push` is a ``GenerationRequest`` with the item's ``context_id``, ``continue: true``,
  ``add_timestamps: true`` and ``output_format`` raw ``pcm_s16le`` at 24 kHz; :meth:`~CartesiaStream.flush`
  sends an empty transcript with ``continue: false``, which ends the context after its audio;
  :meth:`~CartesiaStream.cancel` sends ``{"context_id", "cancel": true}``;
- the server answers per context with ``chunk`` (base64 audio), ``timestamps`` (``word_timestamps.words/start/
  end`` in seconds from the context's first audio), ``flush_done``, ``done`` and ``error``.

:class:`CartesiaContext` is the sans-I/O core of one context: it turns server messages into port events and
places each reported word in the text pushed so far. Cartesia's times already count from the context start, so
they accumulate across pushes by construction; no per-push offset is added. :class:`CartesiaTts` is the shell:
one websocket per call, shared by that call's contexts, opened on first use and again after a drop.

Faults: a refused handshake fails the stream with the handshake's ``retryable`` (401: False). A dropped socket
fails every live stream (retryable). A malformed frame is counted (:attr:`CartesiaTts.malformed_frames`) and fails
every live stream, because it cannot be attributed to one. An ``error`` message fails its stream; 4xx except 429
is not retryable.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
import pybase64

from gateway.providers.errors import ProviderError
from gateway.providers.pipeline.cloud._socket import MALFORMED, EventQueue, VendorSocket
from gateway.providers.pipeline.cloud._words import locate
from gateway.providers.pipeline.ports import TtsAudio, TtsDone, TtsEvent, TtsFailed, TtsWords, Word

log = logging.getLogger(__name__)

DEFAULT_URL = "wss://api.cartesia.ai/tts/websocket"
API_VERSION = "2026-08-14"  # the cartesia SDK 4.x default Cartesia-Version
SAMPLE_RATE = 24_000


@dataclass(frozen=True, slots=True, kw_only=True)
class CartesiaConfig:
    """How to reach Cartesia. ``voice`` is a voice id; ``max_buffer_delay_ms=0`` starts each clause at once (the
    pipeline already sends whole clauses)."""

    url: str = DEFAULT_URL
    api_key: str = field(default="", repr=False)
    model: str = "sonic-3"
    voice: str = ""
    language: str = "en"
    version: str = API_VERSION
    max_buffer_delay_ms: int | None = 0
    open_timeout_s: float = 10.0
    event_queue_size: int = 512

    def __post_init__(self) -> None:
        if self.max_buffer_delay_ms is not None and not 0 <= self.max_buffer_delay_ms <= 5000:
            raise ValueError("max_buffer_delay_ms must be within 0..5000")


def headers(config: CartesiaConfig) -> dict[str, str]:
    out = {"Cartesia-Version": config.version}
    if config.api_key:
        out["Authorization"] = f"Bearer {config.api_key}"
    return out


def generation_request(
    config: CartesiaConfig, *, context_id: str, transcript: str, voice: str, more: bool
) -> dict[str, Any]:
    """A ``GenerationRequest``: ``more`` is ``continue`` (False ends the context after this transcript)."""
    request: dict[str, Any] = {
        "context_id": context_id,
        "model_id": config.model,
        "transcript": transcript,
        "voice": {"mode": "id", "id": voice or config.voice},
        "output_format": {"container": "raw", "encoding": "pcm_s16le", "sample_rate": SAMPLE_RATE},
        "continue": more,
        "add_timestamps": True,
    }
    if config.language:
        request["language"] = config.language
    if config.max_buffer_delay_ms is not None:
        request["max_buffer_delay_ms"] = config.max_buffer_delay_ms
    return request


def cancel_request(context_id: str) -> dict[str, Any]:
    return {"context_id": context_id, "cancel": True}


def _retryable_status(status: int | None) -> bool:
    return status is None or status >= 500 or status == 429


class CartesiaContext:
    """The sans-I/O state of one Cartesia context: the text pushed so far and where its words were placed."""

    def __init__(self, context_id: str) -> None:
        self.context_id = context_id
        self.text = ""
        self._cursor = 0  # char offset after the last word placed
        self.audio_bytes = 0

    def pushed(self, text: str) -> None:
        self.text += text

    def on_message(self, message: Mapping[str, Any]) -> list[TtsEvent]:
        """Events for one server message of this context. Raises ValueError/KeyError/TypeError when malformed."""
        kind = message["type"]
        if kind == "chunk":
            data = message.get("data") or ""
            pcm = pybase64.b64decode(data, validate=True) if data else b""
            if len(pcm) % 2:
                raise ValueError("odd-length PCM16 chunk")
            self.audio_bytes += len(pcm)
            return [TtsAudio(pcm=pcm)] if pcm else []
        if kind == "timestamps":
            stamps = message.get("word_timestamps")
            return [TtsWords(words=self._words(stamps))] if stamps else []
        if kind == "done":
            return [TtsDone()]
        if kind == "error":
            status = message.get("status_code")
            title = message.get("title") or message.get("error_code") or "error"
            text = f"cartesia {status}: {title}: {message.get('message') or ''}".rstrip(": ")
            return [TtsFailed(message=text, retryable=_retryable_status(status))]
        return []  # flush_done, phoneme_timestamps: nothing for the port

    def _words(self, stamps: Mapping[str, Any]) -> tuple[Word, ...]:
        words, starts, ends = stamps["words"], stamps["start"], stamps["end"]
        if not (len(words) == len(starts) == len(ends)):
            raise ValueError("word_timestamps lists differ in length")
        out: list[Word] = []
        for word, start_s, end_s in zip(words, starts, ends):
            char_start, char_end = locate(self.text, self._cursor, str(word))
            self._cursor = char_end
            start_ms = round(float(start_s) * 1000)
            end_ms = max(start_ms, round(float(end_s) * 1000))
            out.append(Word(text=str(word), start_ms=start_ms, end_ms=end_ms, char_start=char_start, char_end=char_end))
        return tuple(out)


def _is_terminal(event: TtsEvent) -> bool:
    return isinstance(event, TtsDone | TtsFailed)


class CartesiaStream:
    """One assistant item: a Cartesia context on the call's socket."""

    timestamps = True

    def __init__(self, owner: CartesiaTts, context_id: str, voice: str) -> None:
        self._owner = owner
        self.context = CartesiaContext(context_id)
        self._voice = voice
        self._queue: EventQueue[TtsEvent] = EventQueue(owner.config.event_queue_size, _is_terminal)
        self._flushed = False

    @property
    def context_id(self) -> str:
        return self.context.context_id

    async def push(self, text: str) -> None:
        if self._flushed or self._queue.closed or not text:
            return
        self.context.pushed(text)
        await self._send(
            generation_request(
                self._owner.config, context_id=self.context_id, transcript=text, voice=self._voice, more=True
            )
        )

    async def flush(self) -> None:
        if self._flushed or self._queue.closed:
            return
        self._flushed = True
        await self._send(
            generation_request(
                self._owner.config, context_id=self.context_id, transcript="", voice=self._voice, more=False
            )
        )

    async def cancel(self) -> None:
        if self._queue.closed:
            self._queue.end()
            return
        self._queue.end()
        self._owner.forget(self.context_id)
        with contextlib.suppress(ProviderError):  # the socket is gone: the context went with it
            await self._owner.send(cancel_request(self.context_id))

    def events(self) -> AsyncIterator[TtsEvent]:
        return self._queue

    async def _send(self, message: Mapping[str, Any]) -> None:
        try:
            await self._owner.send(message)
        except ProviderError as exc:
            self.fail(TtsFailed(message=f"cartesia: {exc}", retryable=exc.retryable))

    def deliver(self, message: Mapping[str, Any]) -> None:
        for event in self.context.on_message(message):
            if _is_terminal(event):
                self._queue.finish(event)
                self._owner.forget(self.context_id)
            elif not self._queue.offer(event):
                self.fail(TtsFailed(message="cartesia: event queue overflow (consumer too slow)", retryable=True))
                return

    def fail(self, event: TtsFailed) -> None:
        self._queue.finish(event)
        self._owner.forget(self.context_id)


class CartesiaTts:
    """The call's Cartesia connection: opens contexts (streams) and routes the server's messages to them."""

    def __init__(self, config: CartesiaConfig) -> None:
        self.config = config
        self._socket: VendorSocket | None = None
        self._connect_lock = asyncio.Lock()
        self._streams: dict[str, CartesiaStream] = {}
        self._ids = itertools.count(1)
        self.malformed_frames = 0

    async def open(self, utterance_id: str, *, voice: str = "") -> CartesiaStream:
        context_id = utterance_id if utterance_id not in self._streams else f"{utterance_id}-{next(self._ids)}"
        stream = CartesiaStream(self, context_id, voice or self.config.voice)
        try:
            await self._ensure_socket()
        except ProviderError as exc:
            stream.fail(TtsFailed(message=f"cartesia: {exc}", retryable=exc.retryable))
            return stream
        self._streams[context_id] = stream
        return stream

    async def aclose(self) -> None:
        socket, self._socket = self._socket, None
        if socket is not None:
            await socket.aclose()
        for stream in list(self._streams.values()):
            stream.fail(TtsFailed(message="cartesia: closed", retryable=False))

    async def send(self, message: Mapping[str, Any]) -> None:
        socket = self._socket
        if socket is None:
            socket = await self._ensure_socket()
        await socket.send_json(message)

    def forget(self, context_id: str) -> None:
        self._streams.pop(context_id, None)

    async def _ensure_socket(self) -> VendorSocket:
        async with self._connect_lock:
            if self._socket is None or not self._socket.is_open:
                self._socket = await VendorSocket.connect(
                    self.config.url,
                    headers(self.config),
                    name="cartesia",
                    on_frame=self._on_frame,
                    on_closed=self._on_closed,
                    open_timeout_s=self.config.open_timeout_s,
                )
            return self._socket

    def _on_frame(self, raw: str | bytes) -> None:
        try:
            message = orjson.loads(raw)
            if not isinstance(message, dict):
                raise TypeError("not a JSON object")
            context_id = message.get("context_id")
            stream = self._streams.get(context_id) if isinstance(context_id, str) else None
            if stream is None:
                if message.get("type") == "error" and context_id is None:
                    self._fail_all(TtsFailed(message=f"cartesia: {message.get('message')}", retryable=True))
                return  # a cancelled context's late messages
            stream.deliver(message)
        except MALFORMED as exc:
            self.malformed_frames += 1
            log.warning("cartesia: malformed frame (%d so far): %r", self.malformed_frames, exc)
            self._fail_all(TtsFailed(message=f"cartesia sent a malformed frame: {exc}", retryable=True))

    def _on_closed(self, code: int | None, reason: str) -> None:
        self._socket = None
        self._fail_all(TtsFailed(message=f"cartesia: connection closed (code {code}: {reason})", retryable=True))

    def _fail_all(self, event: TtsFailed) -> None:
        for stream in list(self._streams.values()):
            stream.fail(event)
