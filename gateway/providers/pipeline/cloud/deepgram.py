"""Deepgram live STT over its websocket (``/v1/listen``), healed across socket drops without losing caller audio.

Protocol (the ``deepgram-sdk`` 7.x ``listen/v1`` client and types, PIPELINE.md §2.1):

- connect ``wss://api.deepgram.com/v1/listen?model=..&encoding=..&sample_rate=..&interim_results=..
  &endpointing=..&utterance_end_ms=..&vad_events=..`` with ``Authorization: Token <key>``; the audio goes as
  binary frames: ``linear16`` at 24000 or 16000 (PCM16 as the pipeline has it) or ``mulaw``/``alaw`` at 8000
  (the call's G.711 as it arrived, no transcoding);
- text frames: ``KeepAlive`` after ``keepalive_s`` without audio (the service closes an idle socket after 10 s,
  NET-0001), ``Finalize`` for :meth:`DeepgramStt.finalize`, ``CloseStream`` on :meth:`~DeepgramStt.aclose`;
- :class:`DeepgramParser` (sans-I/O) maps ``Results`` to :class:`SttPartial` (interim) or :class:`SttFinal`
  (``is_final``, with ``speech_final`` and ``from_finalize``), ``SpeechStarted`` to :class:`SttSpeechStarted`,
  ``UtteranceEnd`` to :class:`SttUtteranceEnd`; ``Metadata`` ends a stream.

Healing: every audio frame sent stays in a replay store until a final result's ``start + duration`` shows the
service processed it. When the socket drops (no close frame, 1011 NET-0001, a server restart), the adapter
reconnects (``reconnect_attempts`` with backoff, and at most that many drops in a row without an answer),
re-sends the unconfirmed audio and then the audio fed meanwhile, in order, and re-sends a ``Finalize`` that was
not answered. The new stream's times restart at zero; the parser adds the audio position the new stream starts
at, so times stay in the call's own timeline. The replay store and the backlog each hold at most
``replay_limit_s`` of audio; a backlog beyond that fails the recogniser, never drops silently.

Events: :meth:`DeepgramStt.events` ends after an :class:`SttFailed`, which is always the last event: a refused
key (``retryable=False``); reconnects exhausted, the backlog overflowing, a malformed frame or an ``Error``
message (``retryable=True``: the pipeline opens a new recogniser). Malformed frames are also counted in
:attr:`DeepgramStt.malformed_frames`. Healed drops say nothing; :attr:`DeepgramStt.reconnects` counts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlencode

import orjson

from gateway.providers._link import cancel_and_wait
from gateway.providers.errors import ProviderClosedError, ProviderConnectError, ProviderError
from gateway.providers.pipeline.cloud._socket import MALFORMED, EventQueue, VendorSocket
from gateway.providers.pipeline.ports import (
    SttEvent,
    SttFailed,
    SttFinal,
    SttPartial,
    SttSpeechStarted,
    SttUtteranceEnd,
)

log = logging.getLogger(__name__)

DEFAULT_URL = "wss://api.deepgram.com/v1/listen"
KEEPALIVE: Mapping[str, str] = {"type": "KeepAlive"}
FINALIZE: Mapping[str, str] = {"type": "Finalize"}
CLOSE_STREAM: Mapping[str, str] = {"type": "CloseStream"}
_FORMATS = {("linear16", 24000), ("linear16", 16000), ("mulaw", 8000), ("alaw", 8000)}
# 1008: the service cannot decode the audio or refuses the options; the same audio again will not help.
_FATAL_CLOSE_CODES = frozenset({1008})


@dataclass(frozen=True, slots=True, kw_only=True)
class DeepgramConfig:
    """How to reach Deepgram and what to ask of it (the query of ``/v1/listen``)."""

    url: str = DEFAULT_URL
    api_key: str = field(default="", repr=False)
    model: str = "nova-3"
    language: str = "en"
    encoding: Literal["linear16", "mulaw", "alaw"] = "linear16"
    sample_rate: int = 16000
    interim_results: bool = True
    endpointing_ms: int | None = 300  # None: endpointing=false
    utterance_end_ms: int | None = 1000  # None: no UtteranceEnd
    vad_events: bool = True
    smart_format: bool = True
    punctuate: bool = True
    keyterms: tuple[str, ...] = ()
    keepalive_s: float = 4.0
    replay_limit_s: float = 10.0
    reconnect_attempts: int = 5
    reconnect_backoff_s: float = 0.2
    open_timeout_s: float = 5.0
    close_timeout_s: float = 2.0
    event_queue_size: int = 256

    def __post_init__(self) -> None:
        if (self.encoding, self.sample_rate) not in _FORMATS:
            raise ValueError("Deepgram input must be linear16 at 24000 or 16000, or mulaw/alaw at 8000")
        if self.utterance_end_ms is not None and not self.interim_results:
            raise ValueError("utterance_end_ms needs interim_results")
        if not 0 < self.keepalive_s < 10:
            raise ValueError("keepalive_s must be within (0, 10): the service closes an idle socket after 10 s")
        if self.replay_limit_s <= 0 or self.reconnect_attempts < 0 or self.event_queue_size < 3:
            raise ValueError("replay_limit_s must be positive, reconnect_attempts >= 0, event_queue_size >= 3")

    @property
    def bytes_per_ms(self) -> int:
        return self.sample_rate // 1000 * (2 if self.encoding == "linear16" else 1)


def build_url(config: DeepgramConfig) -> str:
    query: list[tuple[str, str]] = [
        ("model", config.model),
        ("encoding", config.encoding),
        ("sample_rate", str(config.sample_rate)),
        ("channels", "1"),
        ("interim_results", _flag(config.interim_results)),
        ("endpointing", "false" if config.endpointing_ms is None else str(config.endpointing_ms)),
        ("vad_events", _flag(config.vad_events)),
        ("smart_format", _flag(config.smart_format)),
        ("punctuate", _flag(config.punctuate)),
    ]
    if config.language:
        query.append(("language", config.language))
    if config.utterance_end_ms is not None:
        query.append(("utterance_end_ms", str(config.utterance_end_ms)))
    query += [("keyterm", term) for term in config.keyterms]
    return f"{config.url}?{urlencode(query)}"


def headers(config: DeepgramConfig) -> dict[str, str]:
    return {"Authorization": f"Token {config.api_key}"} if config.api_key else {}


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _ms(seconds: Any) -> int:
    return round(float(seconds) * 1000)


class DeepgramParser:
    """Server messages of one stream to port events, in the call's timeline (``offset_ms`` + the stream's)."""

    def __init__(self, offset_ms: int = 0) -> None:
        self.offset_ms = offset_ms
        self.confirmed_ms = 0  # audio of this stream a final result accounted for
        self.finalize_answered = False

    def parse(self, message: Mapping[str, Any]) -> list[SttEvent]:
        """Raises KeyError/TypeError/ValueError/IndexError when a message is malformed."""
        kind = message["type"]
        if kind == "Results":
            transcript = str(message["channel"]["alternatives"][0]["transcript"])
            if not message.get("is_final"):
                return [SttPartial(text=transcript)] if transcript else []
            self.confirmed_ms = max(self.confirmed_ms, _ms(message["start"]) + _ms(message["duration"]))
            from_finalize = bool(message.get("from_finalize"))
            speech_final = bool(message.get("speech_final"))
            if from_finalize:
                self.finalize_answered = True
            if transcript or from_finalize or speech_final:
                return [SttFinal(text=transcript, speech_final=speech_final, from_finalize=from_finalize)]
            return []
        if kind == "SpeechStarted":
            return [SttSpeechStarted(at_ms=self.offset_ms + _ms(message["timestamp"]))]
        if kind == "UtteranceEnd":
            return [SttUtteranceEnd(last_word_end_ms=self.offset_ms + _ms(message["last_word_end"]))]
        if kind == "Error":
            detail = message.get("description") or message.get("message") or message.get("variant")
            return [SttFailed(message=f"deepgram error: {detail}", retryable=True)]
        return []  # Metadata, ConfigureSuccess/Failure


class _Fatal(Exception):
    def __init__(self, event: SttFailed) -> None:
        super().__init__(event.message)
        self.event = event


class DeepgramStt:
    """One call's recogniser. Build it with :func:`open_deepgram`."""

    def __init__(self, config: DeepgramConfig) -> None:
        self.config = config
        self.input_rate = config.sample_rate
        self.malformed_frames = 0
        self.reconnects = 0
        self._streak = 0  # reconnects since the service last answered: a server that drops at once is bounded
        self._queue: EventQueue[SttEvent] = EventQueue(config.event_queue_size, lambda e: False)
        self._outbox: deque[bytes | Mapping[str, Any]] = deque()
        self._outbox_bytes = 0
        self._replay: deque[tuple[int, bytes]] = deque()  # (stream position, audio) sent, not yet confirmed
        self._replay_bytes = 0
        self._sent_position = 0  # bytes of caller audio sent so far (each byte counted once)
        self._base_position = 0  # where the current stream's audio starts in the call's audio
        self._finalize_unanswered = False
        self._limit = int(config.replay_limit_s * 1000) * config.bytes_per_ms
        self._parser = DeepgramParser()
        self._socket: VendorSocket | None = None
        self._wake = asyncio.Event()
        self._lost = asyncio.Event()
        self._last_send = time.monotonic()
        self._closing = False  # no more input: failed or closing
        self._closed = False  # aclose() ran
        self._run_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Open the first stream; raises ProviderConnectError (``retryable`` False for a refused key)."""
        await self._connect()
        self._run_task = asyncio.create_task(self._run(), name="deepgram-send")

    def feed(self, pcm: bytes) -> None:
        if self._closing or self._queue.closed or not pcm:
            return
        if self._outbox_bytes + len(pcm) > self._limit:
            self._fail(SttFailed(message="deepgram: audio backlog over the replay limit", retryable=True))
            return
        self._outbox.append(pcm)
        self._outbox_bytes += len(pcm)
        self._wake.set()

    def finalize(self) -> None:
        if self._closing or self._queue.closed:
            return
        self._outbox.append(FINALIZE)
        self._wake.set()

    def events(self) -> AsyncIterator[SttEvent]:
        return self._queue

    async def aclose(self) -> None:
        """Send ``CloseStream``, wait (bounded) for the last results and the server's close, then stop."""
        if self._closed:
            return
        self._closed = self._closing = True
        await cancel_and_wait(self._run_task)
        socket, self._socket = self._socket, None
        if socket is not None:
            with contextlib.suppress(ProviderError):
                await self._send_outbox(socket)
                await socket.send_json(CLOSE_STREAM)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.config.close_timeout_s):
                        await self._lost.wait()
            await socket.aclose()
        self._queue.end_quietly()

    # ----------------------------------------------------------------------------------------- the stream

    async def _connect(self) -> None:
        self._lost.clear()
        self._parser = DeepgramParser(offset_ms=self._base_position // self.config.bytes_per_ms)
        self._socket = await VendorSocket.connect(
            build_url(self.config),
            headers(self.config),
            name="deepgram",
            on_frame=self._on_frame,
            on_closed=self._on_closed,
            open_timeout_s=self.config.open_timeout_s,
        )
        self._last_send = time.monotonic()

    async def _run(self) -> None:
        try:
            while True:
                socket = self._socket
                if socket is None or self._lost.is_set():
                    await self._reconnect()
                    continue
                idle_s = self.config.keepalive_s - (time.monotonic() - self._last_send)
                if not self._outbox and idle_s > 0:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(idle_s):
                            await self._wake.wait()
                self._wake.clear()
                try:
                    if self._outbox:
                        await self._send_outbox(socket)
                    elif time.monotonic() - self._last_send >= self.config.keepalive_s:
                        await socket.send_json(KEEPALIVE)
                        self._last_send = time.monotonic()
                except ProviderClosedError:
                    self._lost.set()
        except _Fatal as fatal:
            self._fail(fatal.event)

    async def _send_outbox(self, socket: VendorSocket) -> None:
        while self._outbox:
            item = self._outbox[0]
            if isinstance(item, bytes):
                await socket.send_bytes(item)
                self._replay.append((self._sent_position, item))
                self._replay_bytes += len(item)
                self._sent_position += len(item)
                self._outbox_bytes -= len(item)
                self._trim_replay()
            else:
                await socket.send_json(item)
                if item is FINALIZE:
                    self._finalize_unanswered = True
                    self._parser.finalize_answered = False
            self._outbox.popleft()
            self._last_send = time.monotonic()

    def _trim_replay(self) -> None:
        confirmed = self._base_position + self._parser.confirmed_ms * self.config.bytes_per_ms
        while self._replay and (
            self._replay[0][0] + len(self._replay[0][1]) <= confirmed or self._replay_bytes > self._limit
        ):
            _, chunk = self._replay.popleft()
            self._replay_bytes -= len(chunk)

    async def _reconnect(self) -> None:
        old, self._socket = self._socket, None
        if old is not None:
            await old.aclose()
        self._streak += 1
        if self._streak > self.config.reconnect_attempts:
            raise _Fatal(SttFailed(message=f"deepgram: dropped {self._streak} times without answering", retryable=True))
        self._trim_replay()
        # Resume from the first unconfirmed byte: the new stream's time zero is that audio.
        self._base_position = self._replay[0][0] if self._replay else self._sent_position
        unanswered = self._finalize_unanswered and not self._parser.finalize_answered
        replay = [chunk for _, chunk in self._replay]
        self._replay.clear()
        self._replay_bytes = 0
        self._sent_position = self._base_position
        if unanswered:
            self._outbox.appendleft(FINALIZE)
        for chunk in reversed(replay):
            self._outbox.appendleft(chunk)
            self._outbox_bytes += len(chunk)
        for attempt in range(self.config.reconnect_attempts):
            await asyncio.sleep(self.config.reconnect_backoff_s * (2**attempt))
            try:
                await self._connect()
            except ProviderConnectError as exc:
                if not exc.retryable:
                    raise _Fatal(SttFailed(message=f"deepgram: {exc}", retryable=False)) from exc
                log.info("deepgram: reconnect %d failed: %s", attempt + 1, exc)
                continue
            self.reconnects += 1
            log.info("deepgram: reconnected, replaying %d bytes", sum(len(c) for c in replay))
            return
        raise _Fatal(
            SttFailed(
                message=f"deepgram: no connection after {self.config.reconnect_attempts} attempts", retryable=True
            )
        )

    def _on_frame(self, raw: str | bytes) -> None:
        try:
            message = orjson.loads(raw)
            if not isinstance(message, dict):
                raise TypeError("not a JSON object")
            events = self._parser.parse(message)
            self._streak = 0
        except MALFORMED as exc:
            self.malformed_frames += 1
            log.warning("deepgram: malformed frame (%d so far): %r", self.malformed_frames, exc)
            events = [SttFailed(message=f"deepgram sent a malformed frame: {exc}", retryable=True)]
        self._trim_replay()
        for event in events:
            if isinstance(event, SttFailed):  # the stream is not to be trusted: the pipeline opens a new one
                self._fail(event)
                return
            if not self._queue.offer(event):
                self._fail(SttFailed(message="deepgram: event queue overflow (consumer too slow)", retryable=True))
                return

    def _on_closed(self, code: int | None, reason: str) -> None:
        self._lost.set()
        self._wake.set()
        if self._closing:
            return
        if code in _FATAL_CLOSE_CODES:
            self._fail(SttFailed(message=f"deepgram closed the stream: {code} {reason}", retryable=False))
            return
        log.info("deepgram: stream closed (%s %s), reconnecting", code, reason)

    def _fail(self, event: SttFailed) -> None:
        self._queue.finish(event)
        self._closing = True
        task = self._run_task
        if task is not None and task is not asyncio.current_task():
            task.cancel()


async def open_deepgram(config: DeepgramConfig) -> DeepgramStt:
    """A started recogniser; raises ProviderConnectError when the first stream cannot be opened."""
    stt = DeepgramStt(config)
    await stt.start()
    return stt
