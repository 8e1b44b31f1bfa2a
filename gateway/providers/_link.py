"""One websocket to a realtime provider: a serialized send path and one receive task feeding a bounded queue.

The OpenAI and Gemini adapters compose a :class:`ProviderLink` (livekit's send/receive pair): every write goes
through :meth:`ProviderLink.send` under one lock, one named task reads the socket, turns each JSON message into
:class:`~gateway.providers.base.ProviderEvent` values with the adapter's translator and puts them on a bounded
queue that :meth:`ProviderLink.events` drains. The queue bound is back-pressure: a reader that falls behind
stops the receive task, which stops reading the socket, which lets TCP slow the provider down.

:meth:`ProviderLink.send_nowait` is the media tick's way in: it writes one message synchronously when that
needs no waiting (no send in progress, the socket open, the transport below its write-buffer high-water mark)
and otherwise returns False so the caller falls back to :meth:`ProviderLink.send`. It writes the frame
``Connection.send`` would write, minus the coroutine, the send context and the drain
(docs/adr/0005-synchronous-provider-audio.md), framed by :class:`~gateway.providers._frames.TextFrames`,
which draws its mask keys in blocks instead of one system call per frame (docs/adr/0009-provider-text-frames.md).

The last event is always :class:`~gateway.providers.base.ProviderDisconnected`; it is delivered even when the
queue is full (the oldest queued event makes room) so a consumer never waits forever. ``websockets`` exceptions
are translated here into :mod:`gateway.providers.errors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import orjson
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI
from websockets.protocol import State

from gateway.compiled import caused
from gateway.providers._frames import TextFrames
from gateway.providers.base import ProviderDisconnected, ProviderErrored, ProviderEvent
from gateway.providers.errors import ProviderClosedError, ProviderConnectError

log = logging.getLogger(__name__)

Translate = Callable[[Mapping[str, Any]], Sequence[ProviderEvent]]
# A whole message (text or binary) -> events, for adapters whose protocol core parses the raw frames itself.
Parse = Callable[[str | bytes], Sequence[ProviderEvent]]
Disconnected = Callable[[int | None, str], ProviderDisconnected]

# Close codes after which a new connection may continue the call: normal end, going away (OpenAI session
# expiry, Gemini goAway), abnormal drop (no close frame), server error, restart, try again later, bad gateway.
RETRYABLE_CLOSE_CODES = frozenset({1000, 1001, 1006, 1011, 1012, 1013, 1014})


def close_is_retryable(code: int | None) -> bool:
    """A missing close code means the TCP connection dropped: retryable."""
    return code is None or code in RETRYABLE_CLOSE_CODES


def is_loopback_url(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def open_websocket(url: str, headers: Mapping[str, str], *, open_timeout: float) -> ClientConnection:
    """Connect, translating every failure into :class:`ProviderConnectError` (retryable unless auth/4xx)."""
    try:
        return await connect(
            url,
            additional_headers=dict(headers),
            open_timeout=open_timeout,
            close_timeout=2.0,
            # Provider messages carry base64 audio of whole responses at times; 16 MiB is ample.
            max_size=16 * 1024 * 1024,
            # permessage-deflate costs more CPU per call than base64 audio saves in bandwidth.
            compression=None,
            # Loopback endpoints (the fake server, tests) must never go through an environment proxy.
            proxy=None if is_loopback_url(url) else True,
        )
    except InvalidStatus as exc:
        status = exc.response.status_code
        retryable = status >= 500 or status == 429
        rejected = ProviderConnectError(f"{url}: handshake rejected with HTTP {status}", retryable=retryable)
        raise caused(rejected, exc)  # noqa: B904 (caused(): see gateway.compiled)
    except InvalidURI as exc:
        raise caused(ProviderConnectError(f"invalid provider URL {url!r}", retryable=False), exc)  # noqa: B904 (caused(): see gateway.compiled)
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        failed = ProviderConnectError(f"{url}: {type(exc).__name__}: {exc}", retryable=True)
        raise caused(failed, exc)  # noqa: B904 (caused(): see gateway.compiled)


async def receive_json(ws: ClientConnection, *, wait_s: float, during: str) -> dict[str, Any]:
    """Read one JSON object during a setup handshake (before :meth:`ProviderLink.start`)."""
    try:
        async with asyncio.timeout(wait_s):
            raw = await ws.recv()
    except TimeoutError as exc:
        silent = ProviderConnectError(f"no answer within {wait_s:g} s during {during}", retryable=True)
        raise caused(silent, exc)  # noqa: B904 (caused(): see gateway.compiled)
    except ConnectionClosed as exc:
        code = exc.rcvd.code if exc.rcvd is not None else None
        reason = exc.rcvd.reason if exc.rcvd is not None else ""
        closed = ProviderConnectError(
            f"connection closed during {during} (code {code}: {reason})", retryable=close_is_retryable(code)
        )
        raise caused(closed, exc)  # noqa: B904 (caused(): see gateway.compiled)
    try:
        message = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise caused(ProviderConnectError(f"malformed JSON during {during}", retryable=False), exc)  # noqa: B904 (caused(): see gateway.compiled)
    if not isinstance(message, dict):
        raise ProviderConnectError(f"expected a JSON object during {during}", retryable=False)
    return message


async def send_during_setup(ws: ClientConnection, message: Mapping[str, Any], *, during: str) -> None:
    try:
        await ws.send(orjson.dumps(message), text=True)
    except ConnectionClosed as exc:
        raise caused(ProviderConnectError(f"connection closed during {during}", retryable=True), exc)  # noqa: B904 (caused(): see gateway.compiled)


class ProviderLink:
    """Owns one open websocket after its handshake: the send lock, the receive task and the event queue."""

    def __init__(
        self,
        ws: ClientConnection,
        *,
        name: str,
        translate: Translate | None = None,
        parse: Parse | None = None,
        disconnected: Disconnected,
        queue_size: int = 256,
    ) -> None:
        if (translate is None) == (parse is None):
            raise ValueError("give exactly one of translate and parse")
        self._ws = ws
        self._name = name
        self._translate = translate
        self._parse = parse
        self._disconnected = disconnected
        self._queue: asyncio.Queue[ProviderEvent] = asyncio.Queue(maxsize=queue_size)
        self._send_lock = asyncio.Lock()
        self._sends = 0  # send() calls under way, the ones waiting for the lock too
        # Fixed by the handshake: read once here, not on every write of the tick (they are interpreted attributes).
        self._protocol = ws.protocol
        self._transport = ws.transport
        self._library_frames = bool(ws.protocol.extensions)  # extensions transform frames: the library frames them
        self._frames = TextFrames()
        self._recv_task: asyncio.Task[None] | None = None
        self._closing_by_client = False
        self._finished = False

    @property
    def is_open(self) -> bool:
        return not (self._finished or self._closing_by_client)

    def start(self, first_events: Sequence[ProviderEvent] = ()) -> None:
        for event in first_events:
            self._queue.put_nowait(event)
        self._recv_task = asyncio.create_task(self._receive_loop(), name=f"{self._name}-receive")

    async def send(self, message: Mapping[str, Any]) -> None:
        """Serialize and write one JSON message; raises ProviderClosedError once the connection is gone."""
        await self.send_texts((orjson.dumps(message),))

    async def send_texts(self, messages: Sequence[bytes]) -> None:
        """Write already serialized text messages in order, under one hold of the send lock."""
        if not self.is_open:
            raise ProviderClosedError(f"{self._name}: connection is closed")
        self._sends += 1
        try:
            async with self._send_lock:
                for data in messages:
                    await self._ws.send(data, text=True)
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            closed = ProviderClosedError(
                f"{self._name}: connection closed (code {code})", retryable=close_is_retryable(code)
            )
            raise caused(closed, exc)  # noqa: B904 (caused(): see gateway.compiled)
        finally:
            self._sends -= 1

    def writable(self) -> bool:
        """Whether :meth:`send_nowait` would write now: no send in progress or waiting, the socket open, the
        transport below its write-buffer high-water mark. Raises ProviderClosedError once the connection is gone
        (as :meth:`send` does), so a caller never keeps falling back to a dead link."""
        if self._finished or self._closing_by_client:
            raise ProviderClosedError(f"{self._name}: connection is closed")
        ws = self._ws
        protocol = self._protocol
        return not (
            self._sends
            or ws.send_in_progress is not None
            or protocol.expect_continuation_frame
            or ws.paused
            or protocol.state is not State.OPEN
        )

    def send_nowait(self, data: bytes) -> bool:
        """Write one serialized JSON text message now if that needs no waiting; False: use :meth:`send`."""
        if not self.writable():
            return False
        try:
            if self._library_frames:
                self._protocol.send_text(data)
                self._ws.send_data()
            else:
                self._transport.write(self._frames.frame(data))
        except OSError as exc:  # the socket failed under us; the receive task reports the disconnect
            failed = ProviderClosedError(f"{self._name}: write failed ({exc})", retryable=True)
            raise caused(failed, exc)  # noqa: B904 (caused(): see gateway.compiled)
        return True

    def send_texts_nowait(self, messages: Sequence[bytes]) -> bool:
        """:meth:`send_nowait` for several messages: all of them now, or none (False: use :meth:`send_texts`)."""
        if not self.writable():
            return False
        try:
            for data in messages:
                if self._library_frames:
                    self._protocol.send_text(data)
                    self._ws.send_data()
                else:
                    self._transport.write(self._frames.frame(data))
        except OSError as exc:  # the socket failed under us; the receive task reports the disconnect
            failed = ProviderClosedError(f"{self._name}: write failed ({exc})", retryable=True)
            raise caused(failed, exc)  # noqa: B904 (caused(): see gateway.compiled)
        return True

    def events(self) -> AsyncIterator[ProviderEvent]:
        """The events in arrival order; the last is :class:`ProviderDisconnected`."""
        return Events(self._queue)

    async def aclose(self) -> None:
        """Close the socket, stop the receive task and wait for it. Idempotent."""
        self._closing_by_client = True
        # Stop the receive task first: it may be parked on a full queue, and a parked reader would leave the
        # peer's close frame unread until close_timeout.
        task, self._recv_task = self._recv_task, None
        await cancel_and_wait(task)
        with contextlib.suppress(ConnectionClosed, OSError):
            await self._ws.close()
        if not self._finished:
            # Never started, or cancelled before its first step ran: its finally block did not run either.
            self._finished = True
            self._deliver_last(ProviderDisconnected(reason="closed by client", retryable=False))

    async def _receive_loop(self) -> None:
        final: ProviderDisconnected | None = None
        try:
            async for raw in self._ws:
                for event in self._events_of(raw):
                    await self._queue.put(event)
                    if isinstance(event, ProviderErrored) and event.fatal:
                        # The connection is unusable (session expired, state lost): end it from our side
                        # too, so the consumer gets ProviderDisconnected promptly even if the peer lingers.
                        await self._ws.close(code=1000, reason=event.code)
        except ConnectionClosed:
            pass  # the close code is read below either way
        finally:
            self._finished = True
            if self._closing_by_client:
                final = ProviderDisconnected(reason="closed by client", retryable=False)
            else:
                final = self._disconnected(self._ws.close_code, self._ws.close_reason or "")
            self._deliver_last(final)

    def _events_of(self, raw: str | bytes) -> Sequence[ProviderEvent]:
        if self._parse is not None:
            return self._parse(raw)
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return (ProviderErrored(code="malformed_json", message="provider sent malformed JSON", fatal=False),)
        if not isinstance(message, dict):
            return (ProviderErrored(code="malformed_message", message="expected a JSON object", fatal=False),)
        assert self._translate is not None
        try:
            return self._translate(message)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            # The peer broke its protocol; one bad message must not end the call.
            log.warning("%s: cannot interpret %s: %r", self._name, message.get("type", "?"), exc)
            return (ProviderErrored(code="protocol_error", message=f"cannot interpret message: {exc}", fatal=False),)

    def _deliver_last(self, event: ProviderDisconnected) -> None:
        while self._queue.full():
            self._queue.get_nowait()
        self._queue.put_nowait(event)


class Events:
    """An async iterator over an event queue (a link's, the pipeline session's) that ends after
    :class:`ProviderDisconnected`: a class, because the compiled build (mypyc) cannot compile async generators."""

    def __init__(self, queue: asyncio.Queue[ProviderEvent]) -> None:
        self._queue = queue
        self._ended = False

    def __aiter__(self) -> Events:
        return self

    async def __anext__(self) -> ProviderEvent:
        if self._ended:
            raise StopAsyncIteration
        event = await self._queue.get()
        if isinstance(event, ProviderDisconnected):
            self._ended = True
        return event


async def cancel_and_wait(task: asyncio.Task[Any] | None) -> None:
    """Cancel a task the caller owns and wait for it, re-raising only our own cancellation."""
    if task is None:
        return
    if not task.done():
        task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
