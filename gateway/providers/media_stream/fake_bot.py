"""A small bot server speaking the media-stream protocol, for tests and the bench (never for production).

``FakeBot`` listens on a loopback websocket; each connection is a :class:`BotCall` that records everything the
gateway sent (``connected``, ``start``, every ``media``, ``dtmf``, ``mark`` echo and ``stop``, with arrival
times) and lets a test act as the bot: :meth:`BotCall.send_media`, :meth:`BotCall.send_mark`,
:meth:`BotCall.send_clear`, :meth:`BotCall.send_raw` (garbage included) and :meth:`BotCall.close`. With
``echo=True`` every caller ``media`` payload is sent straight back (the echo agent's behaviour, as a bot), which
is what the bench measures against the built-in echo agent.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed


@dataclass(slots=True, kw_only=True)
class Received:
    at: float
    message: dict[str, Any]


@dataclass(slots=True, kw_only=True, eq=False)
class BotCall:
    """One stream as the bot sees it."""

    ws: ServerConnection
    path: str
    headers: dict[str, str]
    echo: bool = False
    messages: list[Received] = field(default_factory=list)
    close_code: int | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _send_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _stream_sid: str = ""

    # --------------------------------------------------------------------------------------- reading

    def of(self, event: str) -> list[dict[str, Any]]:
        return [r.message for r in self.messages if r.message.get("event") == event]

    @property
    def start(self) -> dict[str, Any]:
        starts = self.of("start")
        return starts[0] if starts else {}

    @property
    def stream_sid(self) -> str:
        return self._stream_sid

    def caller_audio(self) -> bytes:
        """Every inbound media payload, decoded and joined in arrival order."""
        return b"".join(base64.b64decode(m["media"]["payload"]) for m in self.of("media"))

    def mark_echoes(self) -> list[tuple[str, float]]:
        return [(r.message["mark"]["name"], r.at) for r in self.messages if r.message.get("event") == "mark"]

    async def wait_for(self, predicate: Callable[[BotCall], bool], *, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while not predicate(self):
                self._changed.clear()
                await self._changed.wait()

    # --------------------------------------------------------------------------------------- writing

    async def send_json(self, message: dict[str, Any]) -> None:
        await self.send_raw(orjson.dumps(message).decode())

    async def send_raw(self, data: str | bytes) -> None:
        async with self._send_lock:
            await self.ws.send(data)

    async def send_media(self, payload: bytes, *, chunk_bytes: int = 0) -> None:
        """``payload`` as one media message, or as messages of ``chunk_bytes`` (sent back to back)."""
        step = chunk_bytes or len(payload) or 1
        for offset in range(0, len(payload), step):
            body = base64.b64encode(payload[offset : offset + step]).decode()
            await self.send_json({"event": "media", "streamSid": self._stream_sid, "media": {"payload": body}})

    async def send_mark(self, name: str) -> float:
        """Send a mark; returns when it was sent (time.monotonic)."""
        await self.send_json({"event": "mark", "streamSid": self._stream_sid, "mark": {"name": name}})
        return time.monotonic()

    async def send_clear(self) -> float:
        await self.send_json({"event": "clear", "streamSid": self._stream_sid})
        return time.monotonic()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.ws.close(code, reason)

    # ------------------------------------------------------------------------------------------ loop

    async def run(self) -> None:
        try:
            async for raw in self.ws:
                message = orjson.loads(raw)
                self.messages.append(Received(at=time.monotonic(), message=message))
                if message.get("event") == "start":
                    self._stream_sid = message["start"]["streamSid"]
                elif self.echo and message.get("event") == "media":
                    body = message["media"]["payload"]
                    await self.send_json({"event": "media", "streamSid": self._stream_sid, "media": {"payload": body}})
                self._changed.set()
        except ConnectionClosed:
            pass
        finally:
            self.close_code = self.ws.close_code
            self._changed.set()


class FakeBot:
    """``async with FakeBot() as bot:`` a bot on ``bot.url`` (127.0.0.1, a free port)."""

    def __init__(self, *, echo: bool = False, host: str = "127.0.0.1", port: int = 0) -> None:
        self.echo = echo
        self._host = host
        self._port = port
        self._server: Server | None = None
        self.calls: list[BotCall] = []
        self._new_call = asyncio.Event()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = next(iter(self._server.sockets)).getsockname()[1]
        return f"ws://{self._host}:{port}/stream"

    async def __aenter__(self) -> FakeBot:
        self._server = await serve(self._handle, self._host, self._port, compression=None, max_size=16 * 1024 * 1024)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await self._server.wait_closed()

    async def wait_call(self, index: int = 0, *, timeout_s: float = 5.0) -> BotCall:
        """The ``index``-th stream, once its ``start`` arrived."""
        async with asyncio.timeout(timeout_s):
            while len(self.calls) <= index:
                self._new_call.clear()
                await self._new_call.wait()
        call = self.calls[index]
        await call.wait_for(lambda c: bool(c.stream_sid), timeout_s=timeout_s)
        return call

    async def _handle(self, ws: ServerConnection) -> None:
        request = ws.request
        path = request.path if request is not None else ""
        headers = {k.lower(): v for k, v in request.headers.raw_items()} if request is not None else {}
        call = BotCall(ws=ws, path=path, headers=headers, echo=self.echo)
        self.calls.append(call)
        self._new_call.set()
        await call.run()
