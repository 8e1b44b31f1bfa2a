"""The I/O the cloud adapters share: one websocket with a serialized send path and one receive task, and the
bounded event queue a stream or recogniser hands to its consumer.

:class:`VendorSocket` opens the socket through :func:`gateway.providers._link.open_websocket` (so a refused
handshake is a :class:`~gateway.providers.errors.ProviderConnectError` whose ``retryable`` is False for 401/403
and other 4xx), writes under one lock, and runs one named receive task that hands every frame to the adapter's
``on_frame`` and, once, the close code to ``on_closed``. :class:`EventQueue` is bounded: overflow is reported,
never a silent drop (the adapter turns it into a failure event), and iteration ends after a terminal event.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

import orjson
from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed

from gateway.providers._link import cancel_and_wait, open_websocket
from gateway.providers.errors import ProviderClosedError

log = logging.getLogger(__name__)

E = TypeVar("E")

# What a parser raises on a message that breaks its protocol (JSON and base64 errors are ValueErrors): the
# receive callbacks count and report these; anything else is a bug of ours and propagates.
MALFORMED: tuple[type[Exception], ...] = (ValueError, KeyError, TypeError, IndexError, AttributeError, ArithmeticError)


class EventQueue(Generic[E]):
    """A bounded queue of port events, iterated once; iteration ends after an event ``is_terminal`` accepts or
    after :meth:`end`. :meth:`offer` returns False when full (the caller reports the overflow)."""

    def __init__(self, maxsize: int, is_terminal: Callable[[E], bool]) -> None:
        if maxsize < 3:
            raise ValueError("an event queue needs room for at least three events")
        self._queue: asyncio.Queue[E | None] = asyncio.Queue(maxsize=maxsize)
        self._is_terminal = is_terminal
        self._ended = False  # the consumer saw the end
        self._closed = False  # nothing more will be offered

    @property
    def closed(self) -> bool:
        return self._closed

    def offer(self, event: E) -> bool:
        if self._closed:
            return True
        if self._queue.qsize() >= self._queue.maxsize - 2:
            return False  # two slots stay free for a last event and the end marker
        self._queue.put_nowait(event)
        if self._is_terminal(event):
            self._closed = True
        return True

    def finish(self, event: E) -> None:
        """Deliver a last event even when full (the oldest queued events make room), then end."""
        if self._closed:
            return
        while self._queue.qsize() > self._queue.maxsize - 2:
            self._queue.get_nowait()
        self._queue.put_nowait(event)
        self._queue.put_nowait(None)
        self._closed = True

    def end_quietly(self) -> None:
        """End iteration after the events already queued."""
        if self._closed:
            return
        while self._queue.full():
            self._queue.get_nowait()
        self._queue.put_nowait(None)
        self._closed = True

    def end(self) -> None:
        """End iteration now: queued events are discarded (a cancelled stream says nothing more)."""
        self._closed = True
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queue.put_nowait(None)

    def __aiter__(self) -> EventQueue[E]:
        return self

    async def __anext__(self) -> E:
        if self._ended:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event is None or self._is_terminal(event):
            self._ended = True
            if event is None:
                raise StopAsyncIteration
        return event


OnFrame = Callable[[str | bytes], None]
OnClosed = Callable[[int | None, str], None]


class VendorSocket:
    """One open websocket to a vendor: ``send_json``/``send_bytes`` under one lock, one receive task."""

    def __init__(self, ws: ClientConnection, *, name: str, on_frame: OnFrame, on_closed: OnClosed) -> None:
        self._ws = ws
        self._name = name
        self._on_frame = on_frame
        self._on_closed = on_closed
        self._lock = asyncio.Lock()
        self._closing = False
        self._recv_task: asyncio.Task[None] = asyncio.create_task(self._receive(), name=f"{name}-receive")

    @classmethod
    async def connect(
        cls,
        url: str,
        headers: Mapping[str, str],
        *,
        name: str,
        on_frame: OnFrame,
        on_closed: OnClosed,
        open_timeout_s: float,
    ) -> VendorSocket:
        ws = await open_websocket(url, headers, open_timeout=open_timeout_s)
        return cls(ws, name=name, on_frame=on_frame, on_closed=on_closed)

    @property
    def is_open(self) -> bool:
        return not self._closing and not self._recv_task.done()

    async def send_json(self, message: Mapping[str, Any]) -> None:
        await self._send(orjson.dumps(message).decode())

    async def send_bytes(self, data: bytes) -> None:
        await self._send(data)

    async def send_text_bytes(self, data: bytes) -> None:
        """UTF-8 bytes sent as a text frame (JSON built without a str round trip)."""
        await self._send(data, text=True)

    async def _send(self, data: str | bytes, *, text: bool | None = None) -> None:
        if not self.is_open:
            raise ProviderClosedError(f"{self._name}: connection is closed")
        try:
            async with self._lock:
                await self._ws.send(data, text=text)
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd is not None else None
            raise ProviderClosedError(f"{self._name}: connection closed (code {code})") from exc

    async def _receive(self) -> None:
        try:
            async for raw in self._ws:
                self._on_frame(raw)
        except ConnectionClosed:
            pass
        finally:
            if not self._closing:
                self._on_closed(self._ws.close_code, self._ws.close_reason or "")

    async def aclose(self) -> None:
        """Close the socket and stop the receive task. Idempotent; ``on_closed`` is not called."""
        self._closing = True
        await cancel_and_wait(self._recv_task)
        with contextlib.suppress(ConnectionClosed, OSError):
            await self._ws.close()
