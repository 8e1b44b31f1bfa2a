"""``GET /v1/events``: the fleet's event ring as Server-Sent Events (WHATWG HTML §9.2).

Each event is sent as ``id: <n>`` / ``event: <type>`` / ``data: <FleetEvent JSON>``. A client that
reconnects with ``Last-Event-ID`` (or ``?last_event_id=``, for the first connection of a page that read
``GET /v1/calls`` first) gets every later event still in the bounded ring, then the live stream. When
events it asked for have already left the ring, it first gets ``event: gap`` (no id) with
``{"requested": n, "oldest": m}`` so it knows to reload its state from the REST API. A comment line
(``: keepalive``) is sent when nothing happened for ``sse_keepalive_s`` so proxies keep the stream open.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated

import orjson
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.responses import StreamingResponse

from gateway.control.api import ErrorBody, get_plane
from gateway.control.auth import require_token_or_sse_cookie
from gateway.control.plane import ControlPlane
from gateway.fleet.json_errors import ApiError
from gateway.fleet.models import FleetEvent
from gateway.observability import SSE_CLIENTS

router = APIRouter(prefix="/v1")

RETRY_MS = 3000


def format_event(event: FleetEvent) -> bytes:
    return b"id: %d\nevent: %s\ndata: %s\n\n" % (event.id, event.type.encode(), orjson.dumps(event.model_dump()))


def format_gap(requested: int, oldest: int | None) -> bytes:
    return b"event: gap\ndata: %s\n\n" % orjson.dumps({"requested": requested, "oldest": oldest})


async def event_stream(plane: ControlPlane, last_id: int | None, keepalive_s: float) -> AsyncIterator[bytes]:
    SSE_CLIENTS.inc()
    try:
        yield b"retry: %d\n\n" % RETRY_MS
        events, gap, cursor = await plane.events_since(last_id)
        if gap:
            assert last_id is not None
            yield format_gap(last_id, events[0].id if events else None)
        for event in events:
            yield format_event(event)
        stopping = asyncio.ensure_future(plane.shutting_down.wait())
        reader: asyncio.Future[tuple[list[FleetEvent], bool, int]] | None = None
        try:
            while not plane.shutting_down.is_set():
                reader = asyncio.ensure_future(plane.events_since(cursor, wait_s=keepalive_s))
                done, _ = await asyncio.wait({reader, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if reader not in done:
                    break
                events, gap, cursor_after = reader.result()
                if gap:
                    yield format_gap(cursor, events[0].id if events else None)
                if not events:
                    yield b": keepalive\n\n"
                for event in events:
                    yield format_event(event)
                cursor = cursor_after
        finally:
            # Also when the client went away (the generator is cancelled mid-wait): a reader left behind
            # would block in the store (Redis XREAD) for up to keepalive_s and log its error unretrieved.
            pending = [task for task in (reader, stopping) if task is not None]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    finally:
        SSE_CLIENTS.dec()


def _parse_id(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    if not value.isdigit() or len(value) > 18:
        raise ApiError(422, "validation_error", f"Last-Event-ID must be a non-negative integer, not {value[:40]!r}")
    return int(value)


@router.get(
    "/events",
    tags=["events"],
    dependencies=[Depends(require_token_or_sse_cookie)],
    response_class=StreamingResponse,
    responses={
        200: {
            "description": (
                "Server-Sent Events: call.started|updated|ended, worker.registered|updated|draining|lost|gone, and gap"
            ),
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        401: {"model": ErrorBody},
        422: {"model": ErrorBody},
    },
)
async def events(
    request: Request,
    last_event_id_header: Annotated[str | None, Header(alias="Last-Event-ID", max_length=32)] = None,
    last_event_id: Annotated[int | None, Query(ge=0, le=10**17, description="Replay events after this id")] = None,
) -> StreamingResponse:
    """The live event stream. Authenticate with the bearer header, or the cookie from ``POST /v1/session``."""
    plane = get_plane(request)
    header_id = _parse_id(last_event_id_header)
    start = header_id if header_id is not None else last_event_id
    keepalive = plane.config.fleet.sse_keepalive_s
    return StreamingResponse(
        event_stream(plane, start, keepalive),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
