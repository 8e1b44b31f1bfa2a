"""The websocket plumbing every vendor fake shares: listening, auth, records, fault injection, HTTP control.

A vendor fake (Deepgram, ElevenLabs, Cartesia) supplies one coroutine per connection that reads the client's
messages from a :class:`FakeLink` and answers through it; this module owns the rest, the way
:mod:`gateway.providers.fake_server` does for the OpenAI Realtime fake:

- **auth**: with ``api_key`` set, a handshake without that key is refused with HTTP 401, as the vendors do;
- **records**: every client message (JSON text, binary audio) and every server message, per connection
  (:class:`VendorRecord`), so tests can compare what arrived byte for byte and validate what was sent;
- **faults** (:class:`Faults`; each can be set per connection with a query parameter of the same name):
  refuse the handshake with a status, delay every answer, abort the TCP connection after N seconds or N client
  messages, send one malformed frame after N server messages. ``fault_connections=N`` limits them to the
  first N connections so a reconnect finds a healthy server;
- **HTTP** on the same port: ``GET /records``, ``GET /records/<id>``, ``GET /control/<id>?action=drop``,
  ``GET /healthz``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import http
import itertools
import ssl
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import parse_qsl, urlsplit

import orjson
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

T = TypeVar("T")
AuthCheck = Callable[[Headers, Mapping[str, str]], bool]
QueryCheck = Callable[[Mapping[str, str]], str]  # a problem with the query ("": none), answered with HTTP 400
MALFORMED_FRAME = "{not json"


def with_query(options: T, query: Mapping[str, str]) -> T:
    """A copy of a flat frozen dataclass with the fields named in ``query`` parsed from their text."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(options):  # type: ignore[arg-type]
        if f.name not in query:
            continue
        raw = query[f.name]
        current = getattr(options, f.name)
        if not isinstance(current, bool | int | float | str):
            continue  # structured fields are set in code, not from a query
        if isinstance(current, bool):
            changes[f.name] = raw.lower() in {"1", "true", "yes", "on"}
        elif isinstance(current, int):
            changes[f.name] = int(raw)
        elif isinstance(current, float):
            changes[f.name] = float(raw)
        else:
            changes[f.name] = raw
    return dataclasses.replace(options, **changes)  # type: ignore[type-var]


@dataclass(frozen=True, slots=True, kw_only=True)
class Faults:
    """Injected failures (0 = off)."""

    reject_status: int = 0  # refuse the websocket handshake with this HTTP status
    reply_delay_s: float = 0.0  # wait this long before each answer
    drop_after_s: float = 0.0  # abort the TCP connection (the client sees 1006)
    drop_after_messages: int = 0  # abort once this many client messages arrived (audio frames count)
    bad_frame_after: int = 0  # send one malformed text frame after this many server messages
    fault_connections: int = 0  # the faults hit only the first N connections (0: all)

    def without_faults(self) -> Faults:
        return Faults()


@dataclass(slots=True, kw_only=True)
class VendorRecord:
    """What one connection saw: client JSON messages, client audio, server messages, in order. With ``keep``
    False (load runs) only the counts are kept."""

    id: int
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    started_at: float
    keep: bool = True
    audio_bytes: int = 0
    received_count: int = 0
    sent_count: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)
    audio: bytearray = field(default_factory=bytearray)
    audio_frames: int = 0
    sent: list[dict[str, Any]] = field(default_factory=list)
    # ("in", i): received[i] arrived; ("out", i): sent[i] went out; ("audio", n): the n-th binary frame arrived
    timeline: list[tuple[str, int]] = field(default_factory=list)
    ended_at: float | None = None
    close_code: int | None = None

    def add_audio(self, data: bytes, *, frame: bool = True) -> None:
        """Caller audio; ``frame`` False when it came inside a JSON message (already counted as received)."""
        self.audio_bytes += len(data)
        if frame:
            self.audio_frames += 1
        if self.keep:
            self.audio += data
            if frame:
                self.timeline.append(("audio", self.audio_frames))

    def add_received(self, message: dict[str, Any]) -> None:
        self.received_count += 1
        if self.keep:
            self.received.append(message)
            self.timeline.append(("in", len(self.received) - 1))

    def add_sent(self, message: dict[str, Any]) -> None:
        self.sent_count += 1
        if self.keep:
            self.sent.append(message)
            self.timeline.append(("out", len(self.sent) - 1))

    def received_types(self, key: str = "type") -> list[Any]:
        return [m.get(key) for m in self.received]

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "path": self.path,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "close_code": self.close_code,
            "received": self.received_count,
            "audio_bytes": self.audio_bytes,
            "sent": self.sent_count,
        }

    def detail(self) -> dict[str, Any]:
        return {**self.summary(), "headers": self.headers, "received_list": self.received}


class FakeLink:
    """One client connection as a vendor fake sees it: incoming messages, a serialized send, faults."""

    def __init__(self, ws: ServerConnection, record: VendorRecord, faults: Faults, on_change: Callable[[], None]):
        self.ws = ws
        self.record = record
        self.faults = faults
        self._on_change = on_change
        self._send_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._dropped = False

    @property
    def query(self) -> dict[str, str]:
        return self.record.query

    async def messages(self) -> AsyncGenerator[dict[str, Any] | bytes, None]:
        """Client messages until the connection ends: JSON objects, or bytes for binary frames. A text frame that
        is not a JSON object arrives as ``{"__malformed__": text}``."""
        async for raw in self.ws:
            if isinstance(raw, bytes):
                self.record.add_audio(raw)
                item: dict[str, Any] | bytes = raw
            else:
                try:
                    message = orjson.loads(raw)
                except orjson.JSONDecodeError:
                    message = None
                item = message if isinstance(message, dict) else {"__malformed__": raw}
                self.record.add_received(item)
            self._on_change()
            count = self.record.audio_frames + self.record.received_count
            if self.faults.drop_after_messages and count >= self.faults.drop_after_messages:
                await self.drop()
                return
            yield item

    async def send(self, message: Mapping[str, Any]) -> None:
        """Send one JSON message (after the injected reply delay); a no-op once the connection is gone."""
        if self.faults.reply_delay_s:
            await asyncio.sleep(self.faults.reply_delay_s)
        body = dict(message)
        with contextlib.suppress(ConnectionClosed):
            async with self._send_lock:
                await self.ws.send(orjson.dumps(body).decode())
                self.record.add_sent(body)
                if self.faults.bad_frame_after and self.record.sent_count == self.faults.bad_frame_after:
                    await self.ws.send(MALFORMED_FRAME)
        self._on_change()

    async def close(self, code: int = 1000, reason: str = "") -> None:
        await self.ws.close(code, reason)

    async def drop(self) -> None:
        """Abort the TCP connection without a close frame."""
        self._dropped = True
        transport = self.ws.transport
        if transport is not None:
            transport.abort()

    def spawn(self, coro: Awaitable[None], name: str) -> asyncio.Task[None]:
        """A task owned by this connection; cancelled and awaited when the connection ends."""

        async def run() -> None:
            await coro

        task = asyncio.create_task(run(), name=f"fake-{self.record.id}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await task


Handler = Callable[[FakeLink], Awaitable[None]]


class VendorServer:
    """A fake vendor endpoint on 127.0.0.1 (port 0 = ephemeral) serving ``handler`` per connection."""

    def __init__(
        self,
        handler: Handler,
        *,
        faults: Faults | None = None,
        auth: AuthCheck | None = None,
        check_query: QueryCheck | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        keep_records: int = 256,
        keep_messages: bool = True,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.ssl_context = ssl_context
        self.faults = faults or Faults()
        self.host = host
        self._port = port
        self._handler = handler
        self._auth = auth
        self._check_query = check_query
        self.keep_records = keep_records
        self.keep_messages = keep_messages
        self.records: OrderedDict[int, VendorRecord] = OrderedDict()
        self.live: dict[int, FakeLink] = {}
        self._ids = itertools.count(1)
        self._server: Server | None = None
        self._change = asyncio.Event()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("server not started")
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        self._server = await serve(
            self._handle,
            self.host,
            self._port,
            process_request=self._process_request,
            compression=None,
            max_size=16 * 1024 * 1024,
            ping_interval=None,
            ssl=self.ssl_context,
        )

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def record(self, conn_id: int) -> VendorRecord:
        return self.records[conn_id]

    async def drop(self, conn_id: int) -> None:
        await self.live[conn_id].drop()

    async def wait_until(self, predicate: Callable[[], bool], *, within_s: float = 5.0) -> None:
        """Wait until ``predicate()`` holds, re-checked whenever a record changes; TimeoutError after the deadline."""
        async with asyncio.timeout(within_s):
            while not predicate():
                self._change.clear()
                await self._change.wait()

    def _changed(self) -> None:
        self._change.set()

    def _faults_for(self, conn_id: int, query: Mapping[str, str]) -> Faults:
        faults = with_query(self.faults, query)
        if faults.fault_connections and conn_id > faults.fault_connections:
            return faults.without_faults()
        return faults

    async def _handle(self, ws: ServerConnection) -> None:
        request = ws.request
        assert request is not None
        parts = urlsplit(request.path)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        conn_id = next(self._ids)
        try:
            faults = self._faults_for(conn_id, query)
        except ValueError as exc:
            await ws.close(1008, f"bad fault parameters: {exc}"[:120])
            return
        record = VendorRecord(
            id=conn_id,
            path=request.path,
            query=query,
            headers={k.lower(): v for k, v in request.headers.raw_items()},
            started_at=time.time(),
            keep=self.keep_messages,
        )
        self.records[conn_id] = record
        while len(self.records) > self.keep_records:
            self.records.popitem(last=False)
        link = FakeLink(ws, record, faults, self._changed)
        self.live[conn_id] = link
        self._changed()
        if faults.drop_after_s:
            link.spawn(self._drop_later(link, faults.drop_after_s), "drop")
        try:
            await self._handler(link)
        except ConnectionClosed:
            pass
        finally:
            await link.aclose()
            self.live.pop(conn_id, None)
            record.ended_at = time.time()
            record.close_code = ws.close_code
            self._changed()

    @staticmethod
    async def _drop_later(link: FakeLink, after_s: float) -> None:
        await asyncio.sleep(after_s)
        await link.drop()

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        parts = urlsplit(request.path)
        query = dict(parse_qsl(parts.query, keep_blank_values=True))
        if request.headers.get("Upgrade", "").lower() == "websocket":
            try:
                reject = with_query(self.faults, query).reject_status
            except ValueError:
                reject = 0
            if reject:
                try:
                    status = http.HTTPStatus(reject)
                except ValueError:
                    status = http.HTTPStatus.INTERNAL_SERVER_ERROR
                return json_response(status, {"error": status.phrase, "injected": True})
            if self._auth is not None and not self._auth(request.headers, query):
                return json_response(http.HTTPStatus.UNAUTHORIZED, {"error": "Invalid credentials"})
            problem = self._check_query(query) if self._check_query is not None else ""
            if problem:
                return json_response(http.HTTPStatus.BAD_REQUEST, {"error": problem})
            return None
        segments = [s for s in parts.path.split("/") if s]
        try:
            if segments == ["healthz"]:
                return json_response(http.HTTPStatus.OK, {"ok": True, "live": len(self.live)})
            if segments == ["records"]:
                return json_response(http.HTTPStatus.OK, [r.summary() for r in self.records.values()])
            if len(segments) == 2 and segments[0] == "records":
                return json_response(http.HTTPStatus.OK, self.records[int(segments[1])].detail())
            if len(segments) == 2 and segments[0] == "control":
                if query.get("action") != "drop":
                    return json_response(http.HTTPStatus.BAD_REQUEST, {"error": "action must be drop"})
                link = self.live[int(segments[1])]
                link.spawn(link.drop(), "control-drop")
                return json_response(http.HTTPStatus.OK, {"ok": True, "connection": link.record.id})
        except (KeyError, ValueError) as exc:
            return json_response(http.HTTPStatus.NOT_FOUND, {"error": f"unknown connection or bad id: {exc}"})
        return json_response(http.HTTPStatus.NOT_FOUND, {"error": f"no such resource {parts.path}"})


def json_response(status: http.HTTPStatus, body: Any) -> Response:
    data = orjson.dumps(body)
    headers = Headers(
        [("Content-Type", "application/json"), ("Content-Length", str(len(data))), ("Connection", "close")]
    )
    return Response(status.value, status.phrase, headers, data)


def bearer_or_token(headers: Headers, scheme: str, api_key: str) -> bool:
    """Whether ``Authorization: <scheme> <api_key>`` was sent."""
    return headers.get("Authorization", "") == f"{scheme} {api_key}"
