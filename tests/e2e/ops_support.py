"""Helpers for end-to-end tests of the operational surfaces: an SSE reader, a bounded poll, metric lookup.

`EventStream` reads ``GET /v1/events`` in a background task and keeps every parsed event (id, type, data),
so a test can wait for an event with a deadline and later compare what a reconnecting client replays.
`poll` re-evaluates an async condition until it yields a value or the deadline passes (the ops API has
no push channel for "a counter moved", so polling with a deadline is the honest wait there).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")

__all__ = ["EventStream", "SseEvent", "metric_value", "poll"]


@dataclass(frozen=True, kw_only=True)
class SseEvent:
    """One Server-Sent Event as a client sees it (``id`` is None for ``event: gap``)."""

    id: int | None
    type: str
    data: dict[str, Any] = field(repr=False)

    @property
    def call_id(self) -> str | None:
        inner = self.data.get("data")
        return inner.get("id") if isinstance(inner, dict) and self.type.startswith("call.") else None

    @property
    def subject(self) -> dict[str, Any]:
        """The call or worker the event is about."""
        inner = self.data.get("data")
        return inner if isinstance(inner, dict) else {}


class EventStream:
    """``async with EventStream(base_url, token, last_event_id=...) as stream:`` — reads /v1/events."""

    def __init__(
        self,
        base_url: str,
        token: str | None,
        *,
        last_event_id: int | None = None,
        header_id: int | None = None,
        name: str = "sse",
    ) -> None:
        self.base_url = base_url
        self.name = name
        self.events: list[SseEvent] = []
        self.comments = 0
        self.connected = asyncio.Event()
        self.status: int | None = None
        self._headers = {"Accept": "text/event-stream"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        if header_id is not None:
            self._headers["Last-Event-ID"] = str(header_id)
        self._params = {"last_event_id": str(last_event_id)} if last_event_id is not None else {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    async def __aenter__(self) -> EventStream:
        self._task = asyncio.create_task(self._read(), name=f"{self.name}-reader")
        await self.wait_connected(within=10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    async def wait_connected(self, *, within: float) -> None:
        async with asyncio.timeout(within):
            while not self.connected.is_set():
                if self._task is not None and self._task.done():
                    raise RuntimeError(f"{self.name}: event stream ended before it connected: {self._error!r}")
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=0.5)

    async def _read(self) -> None:
        timeout = httpx.Timeout(10.0, read=None)
        try:
            async with (
                httpx.AsyncClient(base_url=self.base_url, timeout=timeout) as client,
                client.stream("GET", "/v1/events", headers=self._headers, params=self._params) as response,
            ):
                self.status = response.status_code
                if response.status_code != 200:
                    raise RuntimeError(f"{self.name}: /v1/events answered {response.status_code}")
                self.connected.set()
                self._changed.set()
                fields: dict[str, str] = {}
                async for line in response.aiter_lines():
                    if line == "":
                        self._dispatch(fields)
                        fields = {}
                    elif line.startswith(":"):
                        self.comments += 1
                    else:
                        key, _, value = line.partition(":")
                        fields[key] = value.removeprefix(" ")
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._changed.set()

    def _dispatch(self, fields: Mapping[str, str]) -> None:
        if "data" not in fields:
            return  # a retry: field alone
        event_id = fields.get("id")
        self.events.append(
            SseEvent(
                id=int(event_id) if event_id else None,
                type=fields.get("event", "message"),
                data=orjson.loads(fields["data"]),
            )
        )
        self._changed.set()

    async def wait_for(self, predicate: Callable[[SseEvent], bool], *, within: float, what: str = "") -> SseEvent:
        """The first event (already received or arriving within ``within`` s) that satisfies ``predicate``."""
        deadline = time.monotonic() + within
        while True:
            self._changed.clear()
            for event in self.events:
                if predicate(event):
                    return event
            if self._task is not None and self._task.done():
                raise RuntimeError(f"{self.name}: stream ended waiting for {what}: {self._error!r}")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                seen = [(e.id, e.type, e.call_id or e.subject.get("id")) for e in self.events[-20:]]
                raise TimeoutError(f"{self.name}: no {what or 'matching event'} in {within}s; last events: {seen}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=remaining)

    def of_call(self, call_id: str) -> list[SseEvent]:
        return [e for e in self.events if e.call_id == call_id]


async def poll(probe: Callable[[], Awaitable[T | None]], *, within: float, what: str, every: float = 0.1) -> T:
    """Evaluate ``probe`` until it returns something other than None/False; that value, or TimeoutError."""
    deadline = time.monotonic() + within
    last: T | None = None
    while True:
        last = await probe()
        if last is not None and last is not False:
            return last
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not reached in {within}s (last probe: {last!r})")
        # The REST API has no notification for this condition: poll it at a gentle pace.
        await asyncio.sleep(every)


def metric_value(text: str, name: str, labels: Mapping[str, str] | None = None) -> float | None:
    """The value of sample ``name`` whose labels include ``labels`` in Prometheus text ``text``, or None."""
    wanted = dict(labels or {})
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in wanted.items()):
                return float(sample.value)
    return None
