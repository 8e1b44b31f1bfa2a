"""Writing ended calls to the database off the call path: a bounded backlog, batches, retries with backoff.

The plane hands an ended call to :meth:`RecordWriter.submit`, which never awaits: nothing of a call (nor the
heartbeat that carried its end) waits on the database. One owned task writes the backlog in batches. A database
that is slow or down keeps the batch in the backlog and is retried with exponential backoff; the backlog is
bounded (``capacity``), and when it is full the oldest record is dropped — counted
(``gateway_db_records_dropped_total``) and logged, never silently. A call submitted again while waiting (a second
end) replaces its earlier snapshot in place.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from gateway.fleet.models import CallSnapshot
from gateway.observability import (
    DB_RECORDS_DROPPED_TOTAL,
    DB_RECORDS_WRITTEN_TOTAL,
    DB_WRITE_BACKLOG,
    DB_WRITE_FAILURES_TOTAL,
)
from gateway.records.database import Database
from gateway.records.errors import DatabaseError
from gateway.records.history import write_records
from gateway.records.outbox import OutboxEvent

log = logging.getLogger(__name__)

WriteBatch = Callable[[Sequence[tuple[CallSnapshot, str]], float], Awaitable[None]]


class OutboxSource(Protocol):
    """The event webhooks (:class:`gateway.control.webhooks.WebhookFeed`): their events of an ended call go in
    the record's transaction, after the call's live events (``flush``), so that they keep their order."""

    async def flush(self) -> None: ...

    def ended_events(self, call: CallSnapshot, profile: str) -> list[OutboxEvent]: ...

    def events_written(self) -> None: ...


class RecordWriter:
    """The plane's writer of call records; ``run()`` is its one task, owned by whoever starts it.

    ``batch``: records per transaction. Building a batch's rows holds the plane's event loop (about 0.3 ms per
    record with a 20-item transcript: docs/performance/2026-12-07-call-records.md), so batches stay small.
    """

    def __init__(
        self,
        database: Database | None,
        *,
        capacity: int = 10_000,
        batch: int = 50,
        backoff_min_s: float = 0.1,
        backoff_max_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        write: WriteBatch | None = None,
        outbox: OutboxSource | None = None,
    ) -> None:
        self.database = database
        self.capacity = capacity
        self.batch = batch
        self.backoff_min_s = backoff_min_s
        self.backoff_max_s = backoff_max_s
        self._clock = clock
        self._write: WriteBatch = write or self._write_records
        self.outbox = outbox
        self._backlog: OrderedDict[str, tuple[CallSnapshot, str]] = OrderedDict()
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self.written = 0
        self.failures = 0
        self.dropped = 0

    async def _write_records(self, records: Sequence[tuple[CallSnapshot, str]], now: float) -> None:
        if self.database is None:
            raise DatabaseError("the database of calls is not open yet")
        events: list[OutboxEvent] = []
        if self.outbox is not None:
            await self.outbox.flush()
            events = [event for call, profile in records for event in self.outbox.ended_events(call, profile)]
        await write_records(self.database, records, now=now, outbox=events)
        if events and self.outbox is not None:
            self.outbox.events_written()

    def attach(self, database: Database) -> None:
        """The database opened (it was unreachable when the writer started): write to it from now on."""
        self.database = database
        self._wake.set()

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    def pending(self, call_id: str) -> CallSnapshot | None:
        """The snapshot of an ended call still waiting to be written, if it is."""
        waiting = self._backlog.get(call_id)
        return waiting[0] if waiting is not None else None

    def pending_calls(self) -> list[CallSnapshot]:
        return [call for call, _ in self._backlog.values()]

    def submit(self, call: CallSnapshot, profile: str) -> None:
        """Queue an ended call to be written (never waits). A full backlog drops its oldest record."""
        if call.id not in self._backlog and len(self._backlog) >= self.capacity:
            dropped, _ = self._backlog.popitem(last=False)
            self.dropped += 1
            DB_RECORDS_DROPPED_TOTAL.inc()
            log.error(
                "call records backlog full (%d): the record of call %s is dropped unwritten (%d dropped so far);"
                " the database of calls is down or too slow",
                self.capacity,
                dropped,
                self.dropped,
            )
        self._backlog[call.id] = (call, profile)
        DB_WRITE_BACKLOG.set(len(self._backlog))
        self._drained.clear()
        self._wake.set()

    async def flush(self, timeout_s: float) -> bool:
        """Wait until the backlog is written (True) or ``timeout_s`` passed (False)."""
        try:
            await asyncio.wait_for(self._drained.wait(), timeout=timeout_s)
        except TimeoutError:
            return False
        return True

    async def run(self) -> None:
        """Write the backlog until cancelled."""
        backoff = self.backoff_min_s
        failing_since: float | None = None
        while True:
            if not self._backlog:
                self._drained.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            taken = list(self._backlog.items())[: self.batch]
            try:
                await self._write([record for _, record in taken], self._clock())
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.failures += 1
                DB_WRITE_FAILURES_TOTAL.inc()
                if failing_since is None:
                    failing_since = self._clock()
                    log.warning("writing %d call records failed (kept, retried): %s", len(taken), exc)
                else:
                    log.debug("writing call records still fails: %s", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.backoff_max_s)
                continue
            if failing_since is not None:
                log.warning(
                    "the database of calls takes writes again after %.1f s; %d records waiting",
                    self._clock() - failing_since,
                    len(self._backlog),
                )
                failing_since = None
            backoff = self.backoff_min_s
            for call_id, record in taken:
                # A call submitted again while its batch was written waits for the next batch with its newer snapshot.
                if self._backlog.get(call_id) is record:
                    del self._backlog[call_id]
            self.written += len(taken)
            DB_RECORDS_WRITTEN_TOTAL.inc(len(taken))
            DB_WRITE_BACKLOG.set(len(self._backlog))
