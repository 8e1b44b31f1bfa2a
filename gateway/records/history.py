"""Reading and writing call records: the batch write, one whole record, the history query, retention's delete.

The history is paged by keyset (a cursor holds the sort key and id of the page's last row), so a page costs the
same wherever it is and rows written meanwhile neither repeat nor vanish. Sort keys: ``started`` and
``duration`` (``-`` first: descending; the default is ``-started``, newest first).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import sqlalchemy as sa

from gateway.fleet.models import CallDirection, CallSnapshot
from gateway.records.database import Database
from gateway.records.models import CallRecord, call_row, record_from_rows, tool_rows, transcript_rows
from gateway.records.outbox import OutboxEvent, insert_events
from gateway.records.schema import calls, tool_calls, transcript_items

SortKey = Literal["started", "-started", "duration", "-duration"]
SORT_KEYS: tuple[SortKey, ...] = ("started", "-started", "duration", "-duration")


class CursorError(ValueError):
    """A cursor this API did not return, or one of another sort."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryQuery:
    """The filters of ``GET /v1/calls`` (None: any), its sort and its page."""

    since: float | None = None  # started at or after (epoch s)
    until: float | None = None  # started before
    number: str | None = None  # the caller's or the called number contains this
    direction: CallDirection | None = None
    end_reason: str | None = None
    profile: str | None = None
    route: str | None = None
    worker: str | None = None
    trunk: str | None = None  # came in on or went out through this trunk
    text: str | None = None  # a transcript item contains this (case-insensitive)
    sort: SortKey = "-started"
    limit: int = 100
    after: tuple[float, str] | None = None  # the decoded cursor


@dataclass(frozen=True, slots=True)
class Page:
    items: list[CallRecord]
    total: int
    more: bool


def sort_value(sort: SortKey, call: CallSnapshot) -> float:
    return call.duration_s if sort.lstrip("-") == "duration" else (call.started or 0.0)


def encode_cursor(sort: SortKey, call: CallSnapshot) -> str:
    raw = orjson.dumps([sort, sort_value(sort, call), call.id])
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str, sort: SortKey) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        made_for, value, call_id = orjson.loads(raw)
        key = (float(value), str(call_id))
    except (ValueError, TypeError, binascii.Error, orjson.JSONDecodeError):
        raise CursorError("cursor is not one this API returned") from None
    if made_for != sort:
        raise CursorError(f"cursor was made for sort={made_for}, not sort={sort}")
    return key


def _like(value: str) -> str:
    escaped = value.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


def _filters(query: HistoryQuery) -> list[sa.ColumnElement[bool]]:
    where: list[sa.ColumnElement[bool]] = []
    if query.since is not None:
        where.append(calls.c.started_at >= query.since)
    if query.until is not None:
        where.append(calls.c.started_at < query.until)
    if query.number:
        pattern = _like(query.number)
        where.append(
            sa.or_(
                sa.func.lower(calls.c.from_number).like(pattern, escape="\\"),
                sa.func.lower(calls.c.to_number).like(pattern, escape="\\"),
            )
        )
    for column, value in (
        (calls.c.direction, query.direction),
        (calls.c.end_reason, query.end_reason),
        (calls.c.profile, query.profile),
        (calls.c.route, query.route),
        (calls.c.worker, query.worker),
        (calls.c.trunk, query.trunk),
    ):
        if value is not None:
            where.append(column == value)
    if query.text:
        said = (
            sa.select(transcript_items.c.call_id)
            .where(transcript_items.c.call_id == calls.c.id)
            .where(sa.func.lower(transcript_items.c.text).like(_like(query.text), escape="\\"))
        )
        where.append(sa.exists(said))
    return where


def _sort_column(sort: SortKey) -> sa.ColumnElement[Any]:
    return calls.c.duration_s if sort.lstrip("-") == "duration" else calls.c.started_at


async def query_history(database: Database, query: HistoryQuery) -> Page:
    """One page of ended calls (without transcripts) matching the query, and how many match in all."""
    where = _filters(query)
    column = _sort_column(query.sort)
    descending = query.sort.startswith("-")
    page_where = list(where)
    if query.after is not None:
        key = sa.tuple_(column, calls.c.id)
        bound = sa.tuple_(sa.literal(query.after[0]), sa.literal(query.after[1]))
        page_where.append(key < bound if descending else key > bound)
    order = [column.desc(), calls.c.id.desc()] if descending else [column.asc(), calls.c.id.asc()]
    select = sa.select(calls).where(*page_where).order_by(*order).limit(query.limit + 1)
    count = sa.select(sa.func.count()).select_from(calls).where(*where)
    async with database.engine.connect() as connection:
        rows = (await connection.execute(select)).mappings().all()
        total = int((await connection.execute(count)).scalar_one())
    items = [record_from_rows(row) for row in rows[: query.limit]]
    return Page(items=items, total=total, more=len(rows) > query.limit)


async def export_history(database: Database, query: HistoryQuery, *, page: int = 500) -> AsyncIterator[CallRecord]:
    """Every record matching the query (transcripts left out), in its order, read a page at a time."""
    after = query.after
    while True:
        found = await query_history(
            database,
            HistoryQuery(**{**_fields(query), "limit": page, "after": after}),
        )
        for record in found.items:
            yield record
        if not found.more or not found.items:
            return
        last = found.items[-1]
        after = (sort_value(query.sort, last), last.id)


def _fields(query: HistoryQuery) -> dict[str, Any]:
    return {name: getattr(query, name) for name in HistoryQuery.__dataclass_fields__}


async def get_record(database: Database, call_id: str) -> CallRecord | None:
    """The whole record of one call (transcript and tool calls in order), or None."""
    async with database.engine.connect() as connection:
        row = (await connection.execute(sa.select(calls).where(calls.c.id == call_id))).mappings().first()
        if row is None:
            return None
        transcript = (
            (
                await connection.execute(
                    sa.select(transcript_items)
                    .where(transcript_items.c.call_id == call_id)
                    .order_by(transcript_items.c.seq)
                )
            )
            .mappings()
            .all()
        )
        tools = (
            (
                await connection.execute(
                    sa.select(tool_calls).where(tool_calls.c.call_id == call_id).order_by(tool_calls.c.seq)
                )
            )
            .mappings()
            .all()
        )
    return record_from_rows(row, transcript, tools)


async def write_records(
    database: Database,
    records: Sequence[tuple[CallSnapshot, str]],
    *,
    now: float,
    outbox: Sequence[OutboxEvent] = (),
) -> None:
    """Write ended calls (snapshot, profile name) in one transaction; a call written before is replaced whole
    (a second end: the worker's own reason after the plane's ``worker_lost``). ``outbox``: the webhook events
    of these ends, inserted in the same transaction, so an end is never kept without its events or sent unkept."""
    ids = [call.id for call, _ in records]
    call_rows = [call_row(call, profile=profile, written_at=now) for call, profile in records]
    item_rows = [row for call, _ in records for row in transcript_rows(call)]
    tool_call_rows = [row for call, _ in records for row in tool_rows(call)]
    async with database.engine.begin() as connection:
        await connection.execute(sa.delete(transcript_items).where(transcript_items.c.call_id.in_(ids)))
        await connection.execute(sa.delete(tool_calls).where(tool_calls.c.call_id.in_(ids)))
        await connection.execute(sa.delete(calls).where(calls.c.id.in_(ids)))
        await connection.execute(sa.insert(calls), call_rows)
        if item_rows:
            await connection.execute(sa.insert(transcript_items), item_rows)
        if tool_call_rows:
            await connection.execute(sa.insert(tool_calls), tool_call_rows)
        await insert_events(connection, outbox)


async def delete_ended_before(
    database: Database, cutoff: float, *, batch: int = 1000, recordings: list[str] | None = None
) -> int:
    """Delete the records of calls that ended before ``cutoff``, ``batch`` calls per transaction; how many.
    ``recordings`` (when given) receives the recording paths of the deleted records, for their files to go."""
    deleted = 0
    while True:
        async with database.engine.begin() as connection:
            selected = sa.select(calls.c.id, calls.c.recording_path).where(calls.c.ended_at < cutoff).limit(batch)
            rows = (await connection.execute(selected)).all()
            ids = [row.id for row in rows]
            if not ids:
                return deleted
            if recordings is not None:
                recordings += [row.recording_path for row in rows if row.recording_path]
            await connection.execute(sa.delete(transcript_items).where(transcript_items.c.call_id.in_(ids)))
            await connection.execute(sa.delete(tool_calls).where(tool_calls.c.call_id.in_(ids)))
            await connection.execute(sa.delete(calls).where(calls.c.id.in_(ids)))
        deleted += len(ids)
