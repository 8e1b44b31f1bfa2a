"""A local OpenAI-Realtime-GA-compatible websocket server for tests and load, with fault injection.

It speaks the GA event set (``openai.types.realtime``; see PROVIDERS.md): ``session.created`` on connect,
``session.updated`` for ``session.update``, ``conversation.item.added``/``done`` for ``conversation.item.create``,
an energy VAD (:mod:`gateway.providers.fake_audio`) over ``input_audio_buffer.append`` that emits
``speech_started``/``speech_stopped``/``committed`` and answers each turn with a response whose audio is the
caller's own turn (mode ``echo``), a tone (``tone``) or generated voice-like audio (``speech-like``), paced in
real time or sent at once. ``response.cancel``, ``conversation.item.truncate`` (refused with the "already
shorter than" error when it points past the audio sent) and ``conversation.item.delete`` behave as the real
service does. A scripted tool call can replace the first answer.

Faults, per server (:class:`FakeOptions`) or per connection (the same names as websocket query parameters, e.g.
``ws://127.0.0.1:PORT/v1/realtime?drop_after_frames=50``): drop the TCP connection after N seconds or N audio
frames, delay replies or the handshake (``session_delay_s``), expire the session (``error`` session_expired then
close 1001), send an arbitrary ``error`` event after N frames. Running connections can be hit from a test
(:meth:`FakeRealtimeServer.inject`, ``drop``, ``expire``) or over HTTP on the same port: ``GET /records``, ``GET
/records/<id>``, ``GET /records/<id>/audio`` (the caller audio of a connection, raw, in arrival order), ``GET
/control/<id>?action=drop|expire|error&code=..&message=..``, ``GET /healthz``. ``fault_connections=N`` limits the
faults to the first N connections, so a client's reconnect finds a healthy server.

Every client event is recorded per connection (:class:`ConnectionRecord`), including the exact caller audio
bytes, so tests can prove frames arrive byte-identical and in order across reconnects, and a timeline of
events in and out with wall-clock times. ``record="meta"``
keeps only event types, sizes and a running SHA-256 of the audio: cheap enough for hundreds of calls.
"""

from __future__ import annotations

import asyncio
import http
import itertools
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import orjson
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from gateway.providers.fake_session import ConnectionRecord, FakeConnection, FakeOptions

__all__ = ["ConnectionRecord", "FakeOptions", "FakeRealtimeServer", "run_fake_server"]


class FakeRealtimeServer:
    """The fake on 127.0.0.1 (port 0 = ephemeral). Use as ``async with FakeRealtimeServer(...) as fake``."""

    def __init__(
        self,
        options: FakeOptions | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        keep_records: int = 256,
        reuse_port: bool = False,
    ) -> None:
        self.options = options or FakeOptions()
        self.host = host
        self._port = port
        # SO_REUSEPORT: several fakes (processes) listen on one port and the kernel spreads connections over them
        self._reuse_port = reuse_port
        self.keep_records = keep_records
        self.records: OrderedDict[int, ConnectionRecord] = OrderedDict()
        self._live: dict[int, FakeConnection] = {}
        self._ids = itertools.count(1)
        self._server: Server | None = None
        self._change = asyncio.Event()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"ws://{self.host}:{self.port}/v1/realtime"

    async def start(self) -> None:
        self._server = await serve(
            self._handle,
            self.host,
            self._port,
            process_request=self._process_request,
            compression=None,
            max_size=16 * 1024 * 1024,
            ping_interval=None,
            reuse_port=self._reuse_port or None,
        )

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def serve_forever(self) -> None:
        await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def __aenter__(self) -> FakeRealtimeServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ----------------------------------------------------------------------------- test-facing API

    def record(self, conn_id: int) -> ConnectionRecord:
        return self.records[conn_id]

    def live_ids(self) -> list[int]:
        return list(self._live)

    async def inject(self, conn_id: int, event: dict[str, Any]) -> None:
        """Send an arbitrary server event on a live connection (e.g. a second ``session.created``)."""
        await self._live[conn_id].send(dict(event))

    async def drop(self, conn_id: int) -> None:
        await self._live[conn_id].drop()

    async def expire(self, conn_id: int) -> None:
        await self._live[conn_id].expire()

    async def wait_until(self, predicate: Callable[[], bool], *, within_s: float = 5.0) -> None:
        """Wait until ``predicate()`` holds, re-checking whenever a record changes; TimeoutError after the deadline."""
        async with asyncio.timeout(within_s):
            while not predicate():
                self._change.clear()
                await self._change.wait()

    def _changed(self) -> None:
        self._change.set()

    # ------------------------------------------------------------------------------- connections

    async def _handle(self, ws: ServerConnection) -> None:
        request = ws.request
        assert request is not None
        parts = urlsplit(request.path)
        conn_id = next(self._ids)
        try:
            options = self.options.with_query(dict(parse_qsl(parts.query)))
        except ValueError as exc:
            await ws.close(1008, f"bad fault parameters: {exc}"[:120])
            return
        if options.fault_connections and conn_id > options.fault_connections:
            options = options.without_faults()
        record = ConnectionRecord(
            id=conn_id,
            path=request.path,
            headers={k.lower(): v for k, v in request.headers.raw_items()},
            options=options,
            started_at=time.time(),
        )
        self.records[record.id] = record
        while len(self.records) > self.keep_records:
            self.records.popitem(last=False)
        connection = FakeConnection(ws, record, on_change=self._changed)
        self._live[record.id] = connection
        self._changed()
        try:
            if "openai-beta" in record.headers:
                # The beta protocol is shut down; the real service refuses it the same way.
                await connection.error("beta_protocol_removed", "The Realtime beta protocol is no longer supported")
                await ws.close(4000, "beta protocol removed")
                return
            await connection.run()
        except ConnectionClosed:
            pass
        finally:
            await connection.aclose()
            self._live.pop(record.id, None)
            record.ended_at = time.time()
            record.close_code = ws.close_code
            self._changed()

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return None
        parts = urlsplit(request.path)
        segments = [s for s in parts.path.split("/") if s]
        try:
            if segments == ["healthz"]:
                return _json_response(http.HTTPStatus.OK, {"ok": True, "live": len(self._live)})
            if segments == ["records"]:
                return _json_response(http.HTTPStatus.OK, [r.summary() for r in self.records.values()])
            if len(segments) == 2 and segments[0] == "records":
                return _json_response(http.HTTPStatus.OK, self.records[int(segments[1])].detail())
            if len(segments) == 3 and segments[0] == "records" and segments[2] == "audio":
                return _audio_response(bytes(self.records[int(segments[1])].audio))
            if len(segments) == 2 and segments[0] == "control":
                return self._control(int(segments[1]), dict(parse_qsl(parts.query)))
        except (KeyError, ValueError) as exc:
            return _json_response(http.HTTPStatus.NOT_FOUND, {"error": f"unknown connection or bad id: {exc}"})
        return _json_response(http.HTTPStatus.NOT_FOUND, {"error": f"no such resource {parts.path}"})

    def _control(self, conn_id: int, query: dict[str, str]) -> Response:
        connection = self._live[conn_id]
        action = query.get("action", "")
        if action == "drop":
            coro: Awaitable[None] = connection.drop()
        elif action == "expire":
            coro = connection.expire()
        elif action == "error":
            coro = connection.error(
                query.get("code", "server_error"),
                query.get("message", "injected error"),
                error_type=query.get("type", "server_error"),
            )
        else:
            return _json_response(http.HTTPStatus.BAD_REQUEST, {"error": "action must be drop, expire or error"})
        connection.spawn(coro, f"control-{action}")
        return _json_response(http.HTTPStatus.OK, {"ok": True, "connection": conn_id, "action": action})


def _audio_response(audio: bytes) -> Response:
    return _response(http.HTTPStatus.OK, "application/octet-stream", audio)


def _json_response(status: http.HTTPStatus, body: Any) -> Response:
    return _response(status, "application/json", orjson.dumps(body))


def _response(status: http.HTTPStatus, content_type: str, body: bytes) -> Response:
    # The websocket server closes the connection after a plain HTTP answer: say so, or a client that keeps
    # connections alive sends its next request into a closed socket.
    headers = Headers([("Content-Type", content_type), ("Content-Length", str(len(body))), ("Connection", "close")])
    return Response(status.value, status.phrase, headers, body)


async def run_fake_server(
    options: FakeOptions, *, host: str, port: int, ready: Callable[[str], None], reuse_port: bool = False
) -> None:
    """Serve until cancelled; ``ready`` receives the websocket URL once listening."""
    server = FakeRealtimeServer(options, host=host, port=port, reuse_port=reuse_port)
    await server.start()
    try:
        ready(server.url)
        await asyncio.Future()
    finally:
        await server.aclose()
