"""OpenAI Realtime transcription (``/v1/realtime?intent=transcription``) as a pipeline speech-to-text.

The GA dialect :mod:`gateway.providers.openai` speaks, in its transcription form (``openai.types.realtime``):
connect with ``intent=transcription`` and ``Authorization: Bearer``, wait for ``session.created``, send one
``session.update`` with ``session.type: "transcription"`` (24 kHz PCM input, the transcription model, language
and prompt, and either ``server_vad`` turn detection or none), wait for ``session.updated``; then caller audio
goes as ``input_audio_buffer.append`` and :meth:`OpenAITranscribeStt.finalize` is ``input_audio_buffer.commit``.

:class:`TranscribeParser` (sans-I/O) maps ``input_audio_buffer.speech_started`` to :class:`SttSpeechStarted`,
``conversation.item.input_audio_transcription.delta`` to :class:`SttPartial` (the item's text so far) and
``.completed`` to :class:`SttFinal` (``speech_final``: the service decided the turn; ``from_finalize``: our
commit did). A turn whose transcription ``.failed`` gets an empty final (logged), so the pipeline never waits for
one; so does a finalize the service refused as an empty commit. Any other ``error``, or a malformed frame, ends
:meth:`~OpenAITranscribeStt.events` with ``SttFailed(retryable=True)``.

There is no resume in this dialect: a dropped socket ends :meth:`~OpenAITranscribeStt.events` with
``SttFailed(retryable=True)`` and the pipeline opens a new recogniser.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
import pybase64

from gateway.providers._link import cancel_and_wait, close_is_retryable, open_websocket, receive_json, send_during_setup
from gateway.providers.errors import ProviderConnectError, ProviderError
from gateway.providers.openai import build_url
from gateway.providers.pipeline.cloud._socket import MALFORMED, EventQueue, VendorSocket
from gateway.providers.pipeline.ports import SttEvent, SttFailed, SttFinal, SttPartial, SttSpeechStarted

log = logging.getLogger(__name__)

DEFAULT_URL = "wss://api.openai.com/v1/realtime"
COMMIT: Mapping[str, str] = {"type": "input_audio_buffer.commit"}
_APPEND_HEAD = b'{"type":"input_audio_buffer.append","audio":"'
_APPEND_TAIL = b'"}'


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenAITranscribeConfig:
    url: str = DEFAULT_URL
    api_key: str = field(default="", repr=False)
    model: str = "gpt-4o-mini-transcribe"
    language: str = ""
    prompt: str = ""
    turn_detection: Literal["server_vad", "none"] = "server_vad"
    silence_duration_ms: int = 500
    vad_threshold: float = 0.5
    backlog_limit_s: float = 10.0  # caller audio waiting to be sent; beyond it the recogniser fails
    open_timeout_s: float = 10.0
    setup_timeout_s: float = 10.0
    event_queue_size: int = 256


def connect_url(config: OpenAITranscribeConfig) -> str:
    url = build_url(config.url, "")
    return f"{url}&intent=transcription" if "?" in url else f"{url}?intent=transcription"


def session_update(config: OpenAITranscribeConfig) -> dict[str, Any]:
    transcription: dict[str, Any] = {"model": config.model}
    if config.language:
        transcription["language"] = config.language
    if config.prompt:
        transcription["prompt"] = config.prompt
    detection: dict[str, Any] | None = None
    if config.turn_detection == "server_vad":
        detection = {
            "type": "server_vad",
            "threshold": config.vad_threshold,
            "silence_duration_ms": config.silence_duration_ms,
        }
    audio_input = {
        "format": {"type": "audio/pcm", "rate": 24000},
        "transcription": transcription,
        "turn_detection": detection,
    }
    return {"type": "session.update", "session": {"type": "transcription", "audio": {"input": audio_input}}}


def append(pcm: bytes) -> bytes:
    """The ``input_audio_buffer.append`` text for ``pcm``, built without a JSON encoder."""
    return _APPEND_HEAD + pybase64.b64encode(pcm) + _APPEND_TAIL


class TranscribeParser:
    """Server events of one transcription session to port events."""

    def __init__(self) -> None:
        self._texts: dict[str, str] = {}
        self.commits_pending = 0  # our commits not yet answered by a completed transcript

    def parse(self, message: Mapping[str, Any]) -> list[SttEvent]:
        kind = message["type"]
        if kind == "input_audio_buffer.speech_started":
            return [SttSpeechStarted(at_ms=int(message["audio_start_ms"]))]
        if kind == "conversation.item.input_audio_transcription.delta":
            item = str(message["item_id"])
            text = self._texts.get(item, "") + str(message.get("delta") or "")
            self._texts[item] = text
            return [SttPartial(text=text)]
        if kind == "conversation.item.input_audio_transcription.completed":
            self._texts.pop(str(message["item_id"]), None)
            from_finalize = self.commits_pending > 0
            self.commits_pending = max(self.commits_pending - 1, 0)
            return [SttFinal(text=str(message["transcript"]), speech_final=True, from_finalize=from_finalize)]
        if kind == "conversation.item.input_audio_transcription.failed":
            self._texts.pop(str(message["item_id"]), None)
            error = message.get("error") or {}
            log.warning("openai transcription of %s failed: %s", message["item_id"], error.get("message"))
            from_finalize = self.commits_pending > 0
            self.commits_pending = max(self.commits_pending - 1, 0)
            return [SttFinal(text="", speech_final=True, from_finalize=from_finalize)]
        if kind == "error":
            error = message["error"]
            if error.get("code") == "input_audio_buffer_commit_empty" and self.commits_pending:
                self.commits_pending -= 1
                return [SttFinal(text="", from_finalize=True)]
            return [SttFailed(message=f"openai: {error.get('code')}: {error.get('message')}", retryable=True)]
        return []


class OpenAITranscribeStt:
    """One call's transcription session. Build it with :func:`open_openai_transcribe`."""

    input_rate = 24000

    def __init__(self, config: OpenAITranscribeConfig) -> None:
        self.config = config
        self.malformed_frames = 0
        self._parser = TranscribeParser()
        self._queue: EventQueue[SttEvent] = EventQueue(config.event_queue_size, lambda e: False)
        self._socket: VendorSocket | None = None
        self._outbox: asyncio.Queue[bytes | Mapping[str, Any]] = asyncio.Queue()
        self._backlog_bytes = 0
        self._backlog_limit = int(config.backlog_limit_s * 48_000)  # 48 bytes per ms at 24 kHz
        self._send_task: asyncio.Task[None] | None = None
        self._closed = False

    async def start(self) -> None:
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        ws = await open_websocket(connect_url(self.config), headers, open_timeout=self.config.open_timeout_s)
        try:
            created = await receive_json(ws, wait_s=self.config.setup_timeout_s, during="session.created")
            if created.get("type") != "session.created":
                raise ProviderConnectError(f"expected session.created, got {created.get('type')}", retryable=False)
            await send_during_setup(ws, session_update(self.config), during="session.update")
            while (answer := await receive_json(ws, wait_s=self.config.setup_timeout_s, during="session.update"))[
                "type"
            ] != "session.updated":
                if answer.get("type") == "error":
                    raise ProviderConnectError(f"session.update refused: {answer.get('error')}", retryable=False)
        except BaseException:
            await ws.close()
            raise
        self._socket = VendorSocket(ws, name="openai-transcribe", on_frame=self._on_frame, on_closed=self._on_closed)
        self._send_task = asyncio.create_task(self._send_loop(), name="openai-transcribe-send")

    def feed(self, pcm: bytes) -> None:
        if self._closed or not pcm:
            return
        if self._backlog_bytes + len(pcm) > self._backlog_limit:
            self._closed = True
            self._queue.finish(SttFailed(message="openai transcribe: audio backlog over the limit", retryable=True))
            return
        self._backlog_bytes += len(pcm)
        self._outbox.put_nowait(pcm)

    def finalize(self) -> None:
        if not self._closed:
            self._parser.commits_pending += 1
            self._outbox.put_nowait(COMMIT)

    def events(self) -> AsyncIterator[SttEvent]:
        return self._queue

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        task, self._send_task = self._send_task, None
        await cancel_and_wait(task)
        socket, self._socket = self._socket, None
        if socket is not None:
            await socket.aclose()
        self._queue.end_quietly()

    async def _send_loop(self) -> None:
        socket = self._socket
        assert socket is not None
        try:
            while True:
                item = await self._outbox.get()
                if isinstance(item, bytes):
                    await socket.send_text_bytes(append(item))
                    self._backlog_bytes -= len(item)
                else:
                    await socket.send_json(item)
        except ProviderError:
            return  # the receive side reports the close

    def _on_frame(self, raw: str | bytes) -> None:
        try:
            message = orjson.loads(raw)
            if not isinstance(message, dict):
                raise TypeError("not a JSON object")
            events = self._parser.parse(message)
        except MALFORMED as exc:
            self.malformed_frames += 1
            log.warning("openai transcribe: malformed frame (%d so far): %r", self.malformed_frames, exc)
            events = [SttFailed(message=f"openai sent a malformed frame: {exc}", retryable=True)]
        for event in events:
            if isinstance(event, SttFailed):
                self._closed = True
                self._queue.finish(event)
                return
            if not self._queue.offer(event):
                self._closed = True
                self._queue.finish(SttFailed(message="openai transcribe: event queue overflow", retryable=True))
                return

    def _on_closed(self, code: int | None, reason: str) -> None:
        self._closed = True
        self._queue.finish(
            SttFailed(message=f"openai transcribe: closed ({code} {reason})", retryable=close_is_retryable(code))
        )


async def open_openai_transcribe(config: OpenAITranscribeConfig) -> OpenAITranscribeStt:
    """A started transcription session; raises ProviderConnectError (``retryable`` False for a refused key)."""
    stt = OpenAITranscribeStt(config)
    await stt.start()
    return stt
