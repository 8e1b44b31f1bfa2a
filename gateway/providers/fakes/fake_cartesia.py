"""A local Cartesia TTS websocket (``/tts/websocket``) for tests and load, with word timestamps and faults.

It speaks the protocol of the ``cartesia`` SDK 4.x: ``GenerationRequest`` messages per ``context_id`` (``continue``
keeps the context open, ``flush`` asks for a ``flush_done``, ``add_timestamps`` for ``timestamps`` messages) and
``CancelContextRequest``. Each request's transcript is rendered by :mod:`gateway.providers.fakes.speech` after the
context's audio so far and sent as ``chunk`` messages of ``chunk_ms`` audio, paced at ``pace`` x real time
(0: at once). After each chunk, the words whose audio has now been sent go out as one ``timestamps`` message, in
seconds from the context's first audio, exactly where the words are in the audio. A request with ``continue``
false ends the context with ``done``; ``cancel`` stops its audio at once and nothing more is sent for it.
Malformed requests get an ``error`` message (status 400), as the service answers.

Faults and records: :mod:`gateway.providers.fakes.vendor_server` (``reject_status=401``, ``drop_after_s``,
``drop_after_messages``, ``bad_frame_after``, ``reply_delay_s``). With ``api_key`` set, a handshake without
``Authorization: Bearer <api_key>`` is refused with 401.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pybase64

from gateway.providers import fake_audio
from gateway.providers.fakes import speech
from gateway.providers.fakes.vendor_server import (
    FakeLink,
    Faults,
    VendorRecord,
    VendorServer,
    bearer_or_token,
    with_query,
)

_RATES = (8000, 16000, 22050, 24000, 44100, 48000)
_ENCODINGS = ("pcm_s16le", "pcm_f32le", "pcm_mulaw", "pcm_alaw")


@dataclass(frozen=True, slots=True, kw_only=True)
class CartesiaOptions:
    chunk_ms: int = 40
    pace: float = 1.0  # 1.0: audio goes out in real time; 0: all at once

    def __post_init__(self) -> None:
        if self.chunk_ms <= 0 or self.pace < 0:
            raise ValueError("chunk_ms must be positive and pace non-negative")


@dataclass(slots=True)
class _Context:
    context_id: str
    requests: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    task: asyncio.Task[None] | None = None
    offset_ms: int = 0  # audio of this context sent so far
    flushes: int = 0


def encode(pcm16: bytes, encoding: str) -> bytes:
    samples = np.frombuffer(pcm16, dtype="<i2")
    if encoding == "pcm_s16le":
        return pcm16
    if encoding == "pcm_f32le":
        return (samples.astype(np.float32) / 32768.0).astype("<f4").tobytes()
    return fake_audio.encode("audio/pcmu" if encoding == "pcm_mulaw" else "audio/pcma", samples)


def _request_problem(message: dict[str, Any]) -> str:
    for key in ("context_id", "model_id", "transcript", "voice", "output_format"):
        if key not in message:
            return f"missing field {key}"
    fmt = message["output_format"]
    if not isinstance(fmt, dict) or fmt.get("container") != "raw":
        return "output_format.container must be raw"
    if fmt.get("encoding") not in _ENCODINGS:
        return f"unsupported encoding {fmt.get('encoding')!r}"
    if fmt.get("sample_rate") not in _RATES:
        return f"unsupported sample_rate {fmt.get('sample_rate')!r}"
    voice = message["voice"]
    if not isinstance(voice, dict) or voice.get("mode") != "id" or not voice.get("id"):
        return "voice must be {mode: id, id}"
    return ""


class FakeCartesiaServer:
    """``async with FakeCartesiaServer() as fake``; point the SDK's ``websocket_base_url`` at :attr:`base_url`."""

    def __init__(
        self,
        options: CartesiaOptions | None = None,
        *,
        faults: Faults | None = None,
        api_key: str | None = None,
        port: int = 0,
        keep_messages: bool = True,
    ) -> None:
        self.options = options or CartesiaOptions()
        auth = None if api_key is None else (lambda h, q: bearer_or_token(h, "Bearer", api_key))
        self.server = VendorServer(self._serve, faults=faults, auth=auth, port=port, keep_messages=keep_messages)

    @property
    def base_url(self) -> str:
        return f"ws://127.0.0.1:{self.server.port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/tts/websocket"

    def record(self, conn_id: int) -> VendorRecord:
        return self.server.record(conn_id)

    async def __aenter__(self) -> FakeCartesiaServer:
        await self.server.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.server.aclose()

    async def _serve(self, link: FakeLink) -> None:
        options = with_query(self.options, link.query)
        contexts: dict[str, _Context] = {}
        async for message in link.messages():
            if isinstance(message, bytes) or "__malformed__" in message:
                await link.send(_error(None, 400, "Invalid message", "expected a JSON text message"))
                continue
            context_id = message.get("context_id")
            if message.get("cancel") is True and isinstance(context_id, str):
                context = contexts.pop(context_id, None)
                if context is not None and context.task is not None:
                    context.task.cancel()
                continue
            problem = _request_problem(message)
            if problem:
                await link.send(
                    _error(context_id if isinstance(context_id, str) else None, 400, "Bad request", problem)
                )
                continue
            assert isinstance(context_id, str)
            context = contexts.get(context_id)
            if context is None:
                context = contexts[context_id] = _Context(context_id)
                context.task = link.spawn(self._speak(link, options, context, contexts), f"context-{context_id}")
            context.requests.put_nowait(message)

    async def _speak(
        self, link: FakeLink, options: CartesiaOptions, context: _Context, contexts: dict[str, _Context]
    ) -> None:
        started = time.monotonic()
        sent_ms = 0  # audio sent on this context, for pacing
        while True:
            request = await context.requests.get()
            fmt = request["output_format"]
            rate = int(fmt["sample_rate"])
            transcript = str(request["transcript"])
            lead = speech.LEAD_MS if context.offset_ms == 0 else 0
            pcm, words = speech.render(transcript, sample_rate=rate, lead_ms=lead)
            pending = list(words)
            step = rate * options.chunk_ms // 1000 * 2
            for first in range(0, len(pcm), step):
                piece = pcm[first : first + step]
                piece_ms = len(piece) * 1000 // (2 * rate)
                if options.pace:
                    due = started + (sent_ms / 1000) / options.pace
                    delay = due - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                await link.send(
                    {
                        "type": "chunk",
                        "context_id": context.context_id,
                        "data": pybase64.b64encode(encode(piece, str(fmt["encoding"]))).decode(),
                        "done": False,
                        "status_code": 206,
                        "step_time": float(options.chunk_ms) / 4,
                    }
                )
                sent_ms += piece_ms
                local_ms = (first + len(piece)) * 1000 // (2 * rate)
                heard = [w for w in pending if w.end_ms <= local_ms]
                if heard and request.get("add_timestamps"):
                    await link.send(_timestamps(context, heard))
                pending = [w for w in pending if w.end_ms > local_ms]
            if pending and request.get("add_timestamps"):
                await link.send(_timestamps(context, pending))
            context.offset_ms += len(pcm) * 1000 // (2 * rate)
            if request.get("flush"):
                context.flushes += 1
                await link.send(
                    {
                        "type": "flush_done",
                        "context_id": context.context_id,
                        "done": False,
                        "flush_done": True,
                        "flush_id": context.flushes,
                        "status_code": 206,
                    }
                )
            if not request.get("continue"):
                contexts.pop(context.context_id, None)
                await link.send({"type": "done", "context_id": context.context_id, "done": True, "status_code": 200})
                return


def _timestamps(context: _Context, words: list[speech.SpokenWord]) -> dict[str, Any]:
    base = context.offset_ms
    return {
        "type": "timestamps",
        "context_id": context.context_id,
        "done": False,
        "status_code": 206,
        "word_timestamps": {
            "words": [w.text for w in words],
            "start": [(base + w.start_ms) / 1000 for w in words],
            "end": [(base + w.end_ms) / 1000 for w in words],
        },
    }


def _error(context_id: str | None, status: int, title: str, message: str) -> dict[str, Any]:
    error: dict[str, Any] = {
        "type": "error",
        "done": True,
        "status_code": status,
        "title": title,
        "message": message,
        "error_code": "invalid_request",
    }
    if context_id is not None:
        error["context_id"] = context_id
    return error
