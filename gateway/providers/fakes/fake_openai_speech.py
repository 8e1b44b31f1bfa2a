"""A local OpenAI-compatible ``POST /v1/audio/speech`` server for tests and load: streamed PCM, faults, records.

It serves the request the ``openai`` SDK's ``audio.speech.create`` sends (``SpeechCreateParams``: ``model``,
``input``, ``voice``, ``instructions``, ``response_format``, ``speed``, ``stream_format``) and answers
``response_format: "pcm"`` (24 kHz mono PCM16, what OpenAI and compatible servers send) with the input rendered
by :mod:`gateway.providers.fakes.speech`, streamed as HTTP/1.1 chunks of ``chunk_ms`` audio at ``pace`` x real
time (0: at once). Other formats and ``stream_format: "sse"`` are refused with 400, a missing or wrong bearer key
(when ``api_key`` is set) with 401, both in OpenAI's error shape. Faults: ``reject_status`` answers every request
with that status, ``reply_delay_s`` waits before the headers, ``drop_after_bytes`` aborts the connection
mid-stream. Every request is recorded (:class:`SpeechRequest`).

It is plain asyncio streams on 127.0.0.1: one request per connection (``Connection: close``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.providers._link import cancel_and_wait
from gateway.providers.fakes import speech

_MAX_BODY = 1 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeechOptions:
    chunk_ms: int = 100
    pace: float = 0.0  # 1.0: audio goes out in real time; 0: all at once
    reject_status: int = 0
    reply_delay_s: float = 0.0
    drop_after_bytes: int = 0  # abort the connection after this many audio bytes (0: never)


@dataclass(slots=True, kw_only=True)
class SpeechRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    status: int = 0
    audio_bytes: int = 0
    started_at: float = field(default_factory=time.time)
    ended_at: float | None = None  # the whole answer was sent
    finished: bool = False  # the connection is over, whichever way


def _error(status: int, message: str, code: str) -> tuple[int, bytes]:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return status, orjson.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}})


class FakeOpenAISpeechServer:
    """``async with FakeOpenAISpeechServer() as fake``; ``AsyncOpenAI(base_url=fake.base_url)``."""

    def __init__(self, options: SpeechOptions | None = None, *, api_key: str | None = None, port: int = 0) -> None:
        self.options = options or SpeechOptions()
        self._port = port
        self.api_key = api_key
        self.requests: list[SpeechRequest] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._change = asyncio.Event()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def __aenter__(self) -> FakeOpenAISpeechServer:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", self._port)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            for task in list(self._tasks):
                await cancel_and_wait(task)
            await self._server.wait_closed()
            self._server = None

    async def wait_until(self, predicate: Any, *, within_s: float = 5.0) -> None:
        async with asyncio.timeout(within_s):
            while not predicate():
                self._change.clear()
                await self._change.wait()

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(self._serve(reader, writer), name="fake-openai-speech")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            request_line, *lines = head.decode("latin-1").split("\r\n")
            method, target, _ = request_line.split(" ", 2)
            headers = {}
            for line in lines:
                if ":" in line:
                    name, value = line.split(":", 1)
                    headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length", "0"))
            raw = await reader.readexactly(min(length, _MAX_BODY)) if length else b""
            try:
                body = orjson.loads(raw) if raw else {}
            except orjson.JSONDecodeError:
                body = {"__malformed__": raw.decode("utf-8", "replace")}
            path = target.split("?", 1)[0]
            record = SpeechRequest(
                method=method, path=path, headers=headers, body=body if isinstance(body, dict) else {}
            )
            self.requests.append(record)
            self._change.set()
            try:
                await self._answer(record, writer)
            finally:
                record.finished = True
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
            self._change.set()

    def _problem(self, record: SpeechRequest) -> tuple[int, bytes] | None:
        options = self.options
        if options.reject_status:
            return _error(options.reject_status, "injected failure", "injected")
        if record.method != "POST" or record.path != "/v1/audio/speech":
            return _error(404, f"no route {record.method} {record.path}", "not_found")
        if self.api_key is not None and record.headers.get("authorization") != f"Bearer {self.api_key}":
            return _error(401, "Incorrect API key provided", "invalid_api_key")
        body = record.body
        for key in ("model", "input", "voice"):
            if not body.get(key):
                return _error(400, f"Missing required parameter: '{key}'.", "missing_required_parameter")
        if body.get("response_format", "mp3") != "pcm":
            return _error(400, "this fake speaks response_format pcm only", "unsupported_format")
        if body.get("stream_format", "audio") != "audio":
            return _error(400, "this fake streams raw audio only (stream_format audio)", "unsupported_format")
        speed = body.get("speed", 1.0)
        if not isinstance(speed, int | float) or not 0.25 <= speed <= 4.0:
            return _error(400, "speed must be within 0.25..4.0", "invalid_value")
        return None

    async def _answer(self, record: SpeechRequest, writer: asyncio.StreamWriter) -> None:
        options = self.options
        if options.reply_delay_s:
            await asyncio.sleep(options.reply_delay_s)
        problem = self._problem(record)
        if problem is not None:
            status, payload = problem
            record.status = status
            writer.write(
                f"HTTP/1.1 {status} Error\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
                f"Connection: close\r\n\r\n".encode()
                + payload
            )
            await writer.drain()
            return
        record.status = 200
        pcm, _ = speech.render(str(record.body["input"]))
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: audio/pcm\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        )
        step = 48 * options.chunk_ms
        started = time.monotonic()
        for first in range(0, len(pcm), step):
            piece = pcm[first : first + step]
            if options.pace:
                delay = started + (first / 48 / 1000) / options.pace - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            if options.drop_after_bytes and record.audio_bytes + len(piece) > options.drop_after_bytes:
                writer.transport.abort()
                return
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await writer.drain()
            record.audio_bytes += len(piece)
            self._change.set()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        record.ended_at = time.time()

    def with_options(self, **changes: Any) -> None:
        """Change the options for the next requests (a test's fault switch)."""
        self.options = dataclasses.replace(self.options, **changes)
