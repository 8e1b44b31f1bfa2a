"""The event webhooks' outbox: rows to deliver, their delivery state, and the queries the deliverer and the
deliveries API make.

One row per event and endpoint. ``status`` is ``pending`` (to send at ``next_attempt_at``), ``delivered`` or
``failed`` (its attempts ran out; a manual redeliver makes it pending again). Rows are delivered in ``id`` order per
(endpoint, call): only the oldest pending row of each such stream is due (:func:`due_heads`), so a failing event
holds back its call's later events to that endpoint and nothing else. ``(endpoint, call_id, dedupe_key)`` is
unique: an event offered twice (two ends of one call, a restart replaying the stream) is inserted once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from gateway.records.database import Database
from gateway.records.schema import webhook_outbox

DeliveryStatus = Literal["pending", "delivered", "failed"]
DELIVERY_STATUSES: tuple[DeliveryStatus, ...] = ("pending", "delivered", "failed")
ERROR_MAX = 512


@dataclass(frozen=True, slots=True, kw_only=True)
class OutboxEvent:
    """An event for one endpoint, as it is inserted: ``body`` is the exact JSON that is signed and sent."""

    msg_id: str
    endpoint: str
    call_id: str
    event_type: str
    dedupe_key: str
    body: str
    created_at: float

    def row(self) -> dict[str, Any]:
        return {
            "msg_id": self.msg_id,
            "endpoint": self.endpoint,
            "call_id": self.call_id,
            "event_type": self.event_type,
            "dedupe_key": self.dedupe_key[:192],
            "body": self.body,
            "status": "pending",
            "attempts": 0,
            "created_at": self.created_at,
            "next_attempt_at": self.created_at,
            "last_error": "",
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """A row of the outbox as the deliverer and the deliveries API see it."""

    id: int
    msg_id: str
    endpoint: str
    call_id: str
    event_type: str
    body: str
    status: DeliveryStatus
    attempts: int
    created_at: float
    next_attempt_at: float | None
    last_attempt_at: float | None
    delivered_at: float | None
    last_status_code: int | None
    last_error: str


def _delivery(row: Any) -> Delivery:
    return Delivery(
        id=int(row.id),
        msg_id=row.msg_id,
        endpoint=row.endpoint,
        call_id=row.call_id,
        event_type=row.event_type,
        body=row.body,
        status=row.status,
        attempts=int(row.attempts),
        created_at=float(row.created_at),
        next_attempt_at=row.next_attempt_at,
        last_attempt_at=row.last_attempt_at,
        delivered_at=row.delivered_at,
        last_status_code=row.last_status_code,
        last_error=row.last_error,
    )


async def insert_events(connection: AsyncConnection, events: Sequence[OutboxEvent]) -> None:
    """Insert events in order inside the caller's transaction; one already there (same key) is left as it is."""
    if not events:
        return
    # The dialects' insert (for ON CONFLICT) is imported here: only a process that writes events pays for it.
    from sqlalchemy.dialects import postgresql, sqlite

    rows = [event.row() for event in events]
    if connection.dialect.name == "postgresql":
        statement: Any = postgresql.insert(webhook_outbox).on_conflict_do_nothing()
    else:
        statement = sqlite.insert(webhook_outbox).on_conflict_do_nothing()
    # One statement per row keeps the ids in the order given (a multi-row insert may not, on PostgreSQL).
    for row in rows:
        await connection.execute(statement, row)


async def write_events(database: Database, events: Sequence[OutboxEvent]) -> None:
    async with database.engine.begin() as connection:
        await insert_events(connection, events)


def _heads() -> sa.Select[Any]:
    earlier = webhook_outbox.alias("earlier")
    blocked = (
        sa.select(earlier.c.id)
        .where(earlier.c.endpoint == webhook_outbox.c.endpoint)
        .where(earlier.c.call_id == webhook_outbox.c.call_id)
        .where(earlier.c.status == "pending")
        .where(earlier.c.id < webhook_outbox.c.id)
    )
    return sa.select(webhook_outbox).where(webhook_outbox.c.status == "pending").where(~sa.exists(blocked))


async def pending_heads(database: Database, *, limit: int) -> list[Delivery]:
    """The oldest pending row of each (endpoint, call), soonest due first: the rows that may be sent next."""
    select = _heads().order_by(webhook_outbox.c.next_attempt_at, webhook_outbox.c.id).limit(limit)
    async with database.engine.connect() as connection:
        rows = (await connection.execute(select)).all()
    return [_delivery(row) for row in rows]


async def record_attempt(
    database: Database,
    delivery_id: int,
    *,
    at: float,
    status: DeliveryStatus,
    next_at: float | None,
    status_code: int | None,
    error: str,
) -> None:
    """Store an attempt's outcome: delivered, pending again at ``next_at``, or failed for good."""
    values: dict[str, Any] = {
        "status": status,
        "attempts": webhook_outbox.c.attempts + 1,
        "last_attempt_at": at,
        "next_attempt_at": next_at,
        "last_status_code": status_code,
        "last_error": error[:ERROR_MAX],
    }
    if status == "delivered":
        values["delivered_at"] = at
    async with database.engine.begin() as connection:
        await connection.execute(sa.update(webhook_outbox).where(webhook_outbox.c.id == delivery_id).values(**values))


async def redeliver(database: Database, delivery_id: int, *, now: float) -> Delivery | None:
    """Make a row pending again, due now, its attempts counted afresh (None: no such row)."""
    async with database.engine.begin() as connection:
        await connection.execute(
            sa.update(webhook_outbox)
            .where(webhook_outbox.c.id == delivery_id)
            .values(status="pending", attempts=0, next_attempt_at=now)
        )
        row = (await connection.execute(sa.select(webhook_outbox).where(webhook_outbox.c.id == delivery_id))).first()
    return _delivery(row) if row is not None else None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryQuery:
    """The filters of ``GET /v1/webhooks/deliveries`` (None: any), newest first, paged by id."""

    status: DeliveryStatus | None = None
    endpoint: str | None = None
    call_id: str | None = None
    event_type: str | None = None
    limit: int = 100
    before: int | None = None  # the cursor: ids below this one


async def list_deliveries(database: Database, query: DeliveryQuery) -> tuple[list[Delivery], bool]:
    """One page of rows matching the query, newest first, and whether more follow."""
    where: list[sa.ColumnElement[bool]] = []
    for column, value in (
        (webhook_outbox.c.status, query.status),
        (webhook_outbox.c.endpoint, query.endpoint),
        (webhook_outbox.c.call_id, query.call_id),
        (webhook_outbox.c.event_type, query.event_type),
    ):
        if value is not None:
            where.append(column == value)
    if query.before is not None:
        where.append(webhook_outbox.c.id < query.before)
    select = sa.select(webhook_outbox).where(*where).order_by(webhook_outbox.c.id.desc()).limit(query.limit + 1)
    async with database.engine.connect() as connection:
        rows = (await connection.execute(select)).all()
    return [_delivery(row) for row in rows[: query.limit]], len(rows) > query.limit


async def get_delivery(database: Database, delivery_id: int) -> Delivery | None:
    async with database.engine.connect() as connection:
        row = (await connection.execute(sa.select(webhook_outbox).where(webhook_outbox.c.id == delivery_id))).first()
    return _delivery(row) if row is not None else None


async def count_pending(database: Database) -> int:
    """Rows waiting to be delivered (read on the status index: delivered rows are not counted one by one)."""
    async with database.engine.connect() as connection:
        count = (
            await connection.execute(
                sa.select(sa.func.count()).select_from(webhook_outbox).where(webhook_outbox.c.status == "pending")
            )
        ).scalar_one()
    return int(count)


async def delete_settled_before(database: Database, cutoff: float, *, batch: int = 1000) -> int:
    """Delete delivered and failed rows created before ``cutoff`` (retention), ``batch`` per transaction; how many."""
    deleted = 0
    while True:
        async with database.engine.begin() as connection:
            ids = (
                (
                    await connection.execute(
                        sa.select(webhook_outbox.c.id)
                        .where(webhook_outbox.c.status != "pending")
                        .where(webhook_outbox.c.created_at < cutoff)
                        .limit(batch)
                    )
                )
                .scalars()
                .all()
            )
            if not ids:
                return deleted
            await connection.execute(sa.delete(webhook_outbox).where(webhook_outbox.c.id.in_(ids)))
        deleted += len(ids)
