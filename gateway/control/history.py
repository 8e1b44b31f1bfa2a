"""Call history for the ops API: live calls from the state store, ended calls from the database of calls.

``GET /v1/calls`` lists both in one order: the store's live calls (and ended calls still waiting in the record
writer's backlog) are filtered here, the database's records by SQL, and the two are merged on the same keyset, so a
cursor pages through both. Without a database (an app whose lifespan did not run: unit tests), the store's calls
are the whole history, as before the database existed.
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orjson

from gateway.fleet.models import CallSnapshot, CallState
from gateway.records import CallRecord, Database, RecordWriter
from gateway.records.history import (
    HistoryQuery,
    encode_cursor,
    export_history,
    get_record,
    query_history,
    sort_value,
)

if TYPE_CHECKING:
    from gateway.control.plane import ControlPlane

EXPORT_COLUMNS = (
    "id",
    "direction",
    "kind",
    "from",
    "to",
    "route",
    "profile",
    "provider",
    "worker",
    "started",
    "answered",
    "ended",
    "duration_s",
    "end_reason",
    "codec",
    "transport",
    "srtp",
    "mos",
    "jitter_ms",
    "loss_pct",
    "concealed",
    "provider_latency_p50_ms",
    "barge_ins",
    "resumes",
    "tool_calls",
    "dtmf",
    "trunk",
)


@dataclass(frozen=True, slots=True)
class HistoryPage:
    items: list[CallRecord]
    next_cursor: str | None
    total: int


class CallHistory:
    """What the ops API reads of calls; the database and its writer are attached when the app's lifespan opens them."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.database: Database | None = None
        self.writer: RecordWriter | None = None

    def attach(self, database: Database, writer: RecordWriter) -> None:
        self.database = database
        self.writer = writer

    def detach(self) -> None:
        self.database = None
        self.writer = None

    def record_of(self, call: CallSnapshot) -> CallRecord:
        """A snapshot from the store as a record (with its profile)."""
        data = call.model_dump(by_alias=True)
        return CallRecord.model_validate({**data, "profile": self.plane.profile_name(call.route)})

    async def _from_store(self, query: HistoryQuery, state: CallState | None, live: bool | None) -> list[CallRecord]:
        calls = await self.plane.list_calls()
        if self.database is not None:
            # Ended calls live in the database; the store's copies count only while they wait to be written.
            writer = self.writer
            calls = [c for c in calls if c.is_live or (writer is not None and writer.pending(c.id) is not None)]
        found = []
        for call in calls:
            if state is not None and call.state != state:
                continue
            if live is not None and call.is_live != live:
                continue
            record = self.record_of(call)
            if matches(record, query):
                found.append(record)
        return found

    async def page(self, query: HistoryQuery, *, state: CallState | None, live: bool | None) -> HistoryPage:
        stored = await self._from_store(query, state, live)
        descending = query.sort.startswith("-")

        def key(call: CallSnapshot) -> tuple[float, str]:
            return (sort_value(query.sort, call), call.id)

        total = len(stored)
        if query.after is not None:
            after = query.after
            stored = [c for c in stored if (key(c) < after if descending else key(c) > after)]
        more = False
        ended_wanted = (state is None or state == "ended") and live is not True
        if self.database is not None and ended_wanted:
            found = await query_history(self.database, query)
            total += found.total
            more = found.more
            seen = {c.id for c in stored}
            stored.extend(c for c in found.items if c.id not in seen)
        stored.sort(key=key, reverse=descending)
        items = stored[: query.limit]
        more = more or len(stored) > query.limit
        next_cursor = encode_cursor(query.sort, items[-1]) if more and items else None
        items = [c.model_copy(update={"transcript": [], "tools": []}) for c in items]
        return HistoryPage(items=items, next_cursor=next_cursor, total=total)

    async def get(self, call_id: str) -> CallRecord | None:
        """A live call's snapshot, else the ended call's whole record (database first, then a pending write)."""
        call = await self.plane.store.get_call(call_id)
        if call is not None and call.is_live:
            return self.record_of(call)
        if self.database is not None:
            pending = self.writer.pending(call_id) if self.writer is not None else None
            if pending is not None:
                return self.record_of(pending)
            record = await get_record(self.database, call_id)
            if record is not None:
                return record
        return self.record_of(call) if call is not None else None

    async def export(self, query: HistoryQuery, fmt: str) -> AsyncIterator[bytes]:
        """The ended calls matching the query, as CSV (a header, one line per call) or JSON lines."""
        records = self._records(query)
        if fmt == "jsonl":
            async for record in records:
                yield orjson.dumps(record.model_dump(mode="json", by_alias=True, exclude={"transcript", "tools"}))
                yield b"\n"
            return
        yield _csv_line(EXPORT_COLUMNS)
        async for record in records:
            yield _csv_line(_csv_values(record))

    async def _records(self, query: HistoryQuery) -> AsyncIterator[CallRecord]:
        if self.database is not None:
            async for record in export_history(self.database, replace(query, after=None)):
                yield record
            return
        page = await self.page(replace(query, limit=1_000_000, after=None), state="ended", live=None)
        for record in page.items:
            yield record


def matches(call: CallRecord, query: HistoryQuery) -> bool:
    """Whether a call from the store passes the history filters (the database applies the same ones in SQL)."""
    started = call.started or 0.0
    if query.since is not None and started < query.since:
        return False
    if query.until is not None and started >= query.until:
        return False
    if query.number and query.number.lower() not in f"{call.from_.lower()}\n{call.to.lower()}":
        return False
    checks: tuple[tuple[Any, Any], ...] = (
        (query.direction, call.direction),
        (query.end_reason, call.end_reason),
        (query.profile, call.profile),
        (query.route, call.route),
        (query.worker, call.worker),
        (query.trunk, call.trunk),
    )
    if any(wanted is not None and wanted != actual for wanted, actual in checks):
        return False
    if query.text:
        text = query.text.lower()
        if not any(text in line.text.lower() for line in call.transcript):
            return False
    return True


def _csv_values(record: CallRecord) -> list[Any]:
    stats = record.stats
    return [
        record.id,
        record.direction,
        record.kind,
        record.from_,
        record.to,
        record.route,
        record.profile,
        record.provider,
        record.worker,
        record.started,
        record.answered,
        record.ended,
        record.duration_s,
        record.end_reason,
        record.codec,
        record.transport,
        record.srtp,
        stats.mos,
        stats.jitter_ms,
        stats.loss_pct,
        stats.concealed,
        stats.provider_latency_p50_ms,
        stats.barge_ins,
        stats.resumes,
        stats.tool_calls,
        record.dtmf,
        record.trunk,
    ]


def _csv_line(values: tuple[str, ...] | list[Any]) -> bytes:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerow(["" if v is None else v for v in values])
    return out.getvalue().encode()
