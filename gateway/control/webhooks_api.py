"""``/v1/webhooks``: the event webhooks' delivery log and the manual redeliver.

``GET /v1/webhooks/deliveries`` lists the outbox's rows newest first (filters: status, endpoint, call, event type;
paged by ``cursor``); ``POST /v1/webhooks/deliveries/{id}/redeliver`` makes one pending again, due now, with its
attempts counted afresh and its ``webhook-id`` unchanged (a receiver that took it already drops it as a duplicate).
"""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, Field

from gateway.control.api import errors
from gateway.control.auth import require_api_token
from gateway.control.webhook_events import WebhookEventType
from gateway.control.webhooks import Webhooks
from gateway.fleet.json_errors import ApiError
from gateway.records.database import Database
from gateway.records.outbox import Delivery, DeliveryQuery, DeliveryStatus, get_delivery, list_deliveries, redeliver

router = APIRouter(prefix="/v1/webhooks", dependencies=[Depends(require_api_token)], tags=["webhooks"])


class DeliveryView(BaseModel):
    """One event for one endpoint and how its delivery went."""

    id: int = Field(description="The delivery's id (for redeliver)")
    webhook_id: str = Field(description="The `webhook-id` header it is sent with, the same on every attempt")
    endpoint: str
    call_id: str
    type: str = Field(description="The event type")
    status: DeliveryStatus = Field(description="pending: to send (again); delivered: 2xx; failed: attempts ran out")
    attempts: int
    created_at: float
    next_attempt_at: float | None = Field(description="When it is sent next (pending only)")
    last_attempt_at: float | None
    delivered_at: float | None
    last_status_code: int | None = Field(description="The HTTP status of the last attempt (null: no answer)")
    last_error: str = Field(description="Why the last attempt failed (empty once delivered)")
    payload: dict[str, Any] = Field(description="The body sent: type, timestamp, data")

    @classmethod
    def of(cls, row: Delivery) -> DeliveryView:
        return cls(
            id=row.id,
            webhook_id=row.msg_id,
            endpoint=row.endpoint,
            call_id=row.call_id,
            type=row.event_type,
            status=row.status,
            attempts=row.attempts,
            created_at=row.created_at,
            next_attempt_at=row.next_attempt_at if row.status == "pending" else None,
            last_attempt_at=row.last_attempt_at,
            delivered_at=row.delivered_at,
            last_status_code=row.last_status_code,
            last_error=row.last_error,
            payload=orjson.loads(row.body),
        )


class DeliveryPage(BaseModel):
    items: list[DeliveryView]
    next_cursor: str | None = Field(default=None, description="Pass as ?cursor= for the next (older) page")


def _database(request: Request) -> tuple[Webhooks, Database]:
    webhooks: Webhooks | None = getattr(request.app.state, "webhooks", None)
    if webhooks is None or webhooks.database is None:
        raise ApiError(503, "database_unavailable", "the database of calls is not open (yet); the log is there")
    return webhooks, webhooks.database


DeliveryId = Annotated[int, Path(ge=1, le=2**62, description="A delivery's id")]


@router.get("/deliveries", response_model=DeliveryPage, responses=errors(503))
async def deliveries(
    request: Request,
    status: Annotated[DeliveryStatus | None, Query(description="pending, delivered or failed")] = None,
    endpoint: Annotated[str | None, Query(max_length=64, description="An endpoint's name")] = None,
    call_id: Annotated[str | None, Query(max_length=128)] = None,
    type: Annotated[WebhookEventType | None, Query(description="An event type")] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    cursor: Annotated[str | None, Query(max_length=24, description="next_cursor of the previous page")] = None,
) -> Any:
    """The delivery log: one item per event and endpoint, newest first."""
    before: int | None = None
    if cursor is not None:
        if not cursor.isdigit() or int(cursor) < 1:
            raise ApiError(400, "bad_cursor", "cursor is not one this API returned")
        before = int(cursor)
    _, database = _database(request)
    query = DeliveryQuery(
        status=status, endpoint=endpoint, call_id=call_id, event_type=type, limit=limit, before=before
    )
    rows, more = await list_deliveries(database, query)
    return DeliveryPage(
        items=[DeliveryView.of(row) for row in rows], next_cursor=str(rows[-1].id) if more and rows else None
    )


@router.get("/deliveries/{delivery_id}", response_model=DeliveryView, responses=errors(404, 503))
async def delivery(request: Request, delivery_id: DeliveryId) -> Any:
    """One delivery."""
    _, database = _database(request)
    row = await get_delivery(database, delivery_id)
    if row is None:
        raise ApiError(404, "delivery_not_found", f"no webhook delivery {delivery_id}")
    return DeliveryView.of(row)


@router.post("/deliveries/{delivery_id}/redeliver", response_model=DeliveryView, responses=errors(404, 503))
async def redeliver_one(request: Request, delivery_id: DeliveryId) -> Any:
    """Send a delivery again (failed, or delivered and wanted again): pending now, attempts counted afresh."""
    webhooks, database = _database(request)
    clock = request.app.state.clock
    row = await redeliver(database, delivery_id, now=clock())
    if row is None:
        raise ApiError(404, "delivery_not_found", f"no webhook delivery {delivery_id}")
    webhooks.wake()
    return DeliveryView.of(row)
