"""Event webhooks end to end inside one control plane: the plane's events and ended records go through the outbox
(a real database on each engine) to a real HTTP receiver that verifies every signature, fails on purpose and is
down for a while; every event arrives once after de-duplication by ``webhook-id``, in order per call. The
deliveries API lists, filters, pages and redelivers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy.exc import SQLAlchemyError

from gateway.control.app import create_app
from gateway.control.plane import ControlPlane
from gateway.control.settings import ControlSettings
from gateway.control.webhook_events import WEBHOOK_EVENT_TYPES
from gateway.control.webhooks import Endpoint, EventWebhookSettings, WebhookFeed
from gateway.fleet.models import CallSnapshot, WorkerEvent
from gateway.observability import REGISTRY
from gateway.records import Database, RecordWriter, RetentionJob, open_database
from gateway.records.database import create_engine
from gateway.records.outbox import DeliveryQuery, list_deliveries
from tests.gateway.control.conftest import AUTH, TOKEN, make_config
from tests.gateway.records.conftest import database_url, ended_call, postgres
from tests.support.procs import free_ports
from tests.support.webhook_receiver import WebhookReceiver

__all__ = ["database_url", "postgres"]  # fixtures of the database of calls, on each engine

SECRET = "whsec_dGVzdC1zZWNyZXQtb2YtdGhlLXdlYmhvb2tzLTAxMjM0NQ=="
EXPECTED = ["call.started", "call.answered", "call.transcript", "tool.called", "call.ended"]


@dataclass
class Plane:
    app: FastAPI
    plane: ControlPlane
    client: httpx.AsyncClient

    async def get(self, path: str, **params: Any) -> Any:
        response = await self.client.get(path, params=params)
        assert response.status_code == 200, response.text
        return response.json()

    async def deliveries(self, **params: Any) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = (await self.get("/v1/webhooks/deliveries", limit=500, **params))["items"]
        return items

    async def wait_deliveries(self, check: Callable[[list[dict[str, Any]]], bool], *, within: float) -> None:
        async with asyncio.timeout(within):
            while True:
                if check(await self.deliveries()):
                    return
                await asyncio.sleep(0.05)  # polling the log, bounded by the deadline

    async def call(self, call_id: str) -> None:
        """A call's life as its worker reports it: ringing, answered, ended (the record's snapshot)."""
        base = {"id": call_id, "from": "+15550100", "to": "+15550199", "route": "support", "started": 1.0}
        for state, extra in (("ringing", {}), ("active", {"answered": 2.0})):
            call = CallSnapshot.model_validate({**base, "state": state, **extra})
            await self.plane.report([WorkerEvent(type="call.updated", worker="worker-a", time=1.0, call=call)])
        ended = ended_call(call_id, route="support")
        await self.plane.report([WorkerEvent(type="call.ended", worker="worker-a", time=3.0, call=ended)])


@pytest.fixture
def receiver() -> WebhookReceiver:
    return WebhookReceiver(SECRET)


def _app(database_url: str, receiver: WebhookReceiver, **webhook: Any) -> FastAPI:
    settings = ControlSettings(api_token=TOKEN, database_url=database_url, retention_days=0, webhook_secret=SECRET)
    delivery = EventWebhookSettings(
        **{"backoff_min_s": 0.05, "backoff_max_s": 0.3, "max_attempts": 1000, "timeout_s": 2.0, **webhook}
    )
    config = make_config(webhooks=[{"name": "app", "url": receiver.url}])
    return create_app(settings, config=config, sweeper=False, webhook_settings=delivery)


@pytest.fixture
async def plane(database_url: str, receiver: WebhookReceiver, request: pytest.FixtureRequest) -> AsyncIterator[Plane]:
    webhook: dict[str, Any] = getattr(request, "param", {})
    app = _app(database_url, receiver, **webhook)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://control.test", headers=AUTH) as client:
            yield Plane(app=app, plane=app.state.plane, client=client)
    await receiver.stop()


async def test_every_event_arrives_once_in_order_through_failures_and_an_outage(
    plane: Plane, receiver: WebhookReceiver
) -> None:
    calls = ["c-a", "c-b", "c-c"]
    for call_id in calls:
        await plane.call(call_id)
    # The receiver is down: every call's first event is tried, refused, and kept for later.
    await plane.wait_deliveries(
        lambda rows: sum(1 for r in rows if r["attempts"] >= 2 and r["status"] == "pending") == len(calls),
        within=20,
    )
    refused = await plane.deliveries(status="pending", type="call.started")
    assert len(refused) == 3 and all("Connect" in row["last_error"] for row in refused), refused
    assert all(row["next_attempt_at"] is not None and row["last_status_code"] is None for row in refused)

    receiver.fail_next = 5  # up, but failing for a while
    await receiver.start()
    await receiver.wait_for(lambda r: all(len(r.types_by_call().get(c, [])) == 5 for c in calls), within=30)
    assert receiver.rejected == [] and receiver.failed == 5
    assert receiver.types_by_call() == {call_id: EXPECTED for call_id in calls}
    unique = receiver.unique()
    assert len(unique) == 15

    rows = await plane.deliveries()
    await plane.wait_deliveries(lambda rows: all(r["status"] == "delivered" for r in rows), within=10)
    rows = await plane.deliveries()
    assert {row["webhook_id"] for row in rows} == set(unique)  # the ids sent are the log's, kept across attempts
    assert max(row["attempts"] for row in rows) >= 3 and all(row["last_error"] == "" for row in rows)
    ended = unique[next(r["webhook_id"] for r in rows if r["type"] == "call.ended" and r["call_id"] == "c-b")]
    assert ended.data["end_reason"] == "caller_hangup" and ended.data["duration_s"] == 30.0
    assert ended.data["from"] == "+15550100" and ended.data["stats"]["mos"] == 4.31

    # A second end of a call (its worker's own reason after the plane's) is not a second call.ended.
    await plane.plane.report(
        [WorkerEvent(type="call.ended", worker="worker-a", time=4.0, call=ended_call("c-b", end_reason="bye"))]
    )
    writer = plane.plane.records
    assert isinstance(writer, RecordWriter) and await writer.flush(10) and writer.written == 4
    assert len(await plane.deliveries(call_id="c-b", type="call.ended")) == 1


def _metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_the_log_filters_pages_and_redelivers(plane: Plane, receiver: WebhookReceiver) -> None:
    delivered_before = _metric("gateway_webhook_delivered_total")
    ok_before = _metric("gateway_webhook_attempts_total", outcome="ok")
    await receiver.start()
    for call_id in ("c-a", "c-b"):
        await plane.call(call_id)
    await receiver.wait_for(lambda r: len(r.unique()) == 10, within=20)
    await plane.wait_deliveries(lambda rows: all(r["status"] == "delivered" for r in rows), within=10)
    assert _metric("gateway_webhook_delivered_total") - delivered_before == 10
    assert _metric("gateway_webhook_attempts_total", outcome="ok") - ok_before == 10
    assert len(await plane.deliveries(type="call.ended")) == 2
    assert [r["type"] for r in reversed(await plane.deliveries(call_id="c-a"))] == EXPECTED
    assert await plane.deliveries(endpoint="nobody") == []
    seen: list[int] = []
    cursor = None
    while True:
        page = await plane.get("/v1/webhooks/deliveries", limit=3, **({"cursor": cursor} if cursor else {}))
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == 10 and seen == sorted(seen, reverse=True)

    (ended,) = await plane.deliveries(call_id="c-a", type="call.ended")
    answer = await plane.client.post(f"/v1/webhooks/deliveries/{ended['id']}/redeliver")
    assert answer.status_code == 200 and answer.json()["status"] == "pending" and answer.json()["attempts"] == 0
    # Sent again with the same webhook-id: the receiver sees a duplicate it drops.
    await receiver.wait_for(lambda r: [x.webhook_id for x in r.received].count(ended["webhook_id"]) == 2, within=10)

    assert (await plane.client.post("/v1/webhooks/deliveries/999999/redeliver")).status_code == 404
    assert (await plane.client.post("/v1/webhooks/deliveries/0/redeliver")).status_code == 422
    bad = await plane.client.get("/v1/webhooks/deliveries", params={"cursor": "abc"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_cursor"
    assert (await plane.client.get("/v1/webhooks/deliveries", params={"status": "lost"})).status_code == 422
    assert (await plane.client.get("/v1/webhooks/deliveries", params={"type": "call.nope"})).status_code == 422
    assert (await plane.client.get("/v1/webhooks/deliveries", headers={"Authorization": "Bearer x"})).status_code == 401

    # Retention deletes the log with the records: two days on, a one-day retention leaves nothing delivered.
    await plane.wait_deliveries(lambda rows: all(r["status"] == "delivered" for r in rows), within=10)
    database = plane.app.state.webhooks.database
    later = RetentionJob(database, retention_days=1, clock=lambda: time.time() + 2 * 86_400)
    assert await later.sweep() == 2
    assert await plane.deliveries() == []


@pytest.mark.parametrize("plane", [{"max_attempts": 3}], indirect=True)
async def test_a_failing_event_holds_back_only_its_own_call(plane: Plane, receiver: WebhookReceiver) -> None:
    receiver.fail_call = "c-a"
    await receiver.start()
    await plane.call("c-a")
    await plane.call("c-b")
    # c-b's events all arrive while c-a's first is failing; c-a's first fails 3 times, is given up, and its later
    # events follow (given up too, the receiver refuses that call).
    await receiver.wait_for(lambda r: r.types_by_call().get("c-b") == EXPECTED, within=20)
    await plane.wait_deliveries(
        lambda rows: sum(1 for r in rows if r["call_id"] == "c-a" and r["status"] == "failed") == 5, within=20
    )
    failed = await plane.deliveries(call_id="c-a")
    assert all(r["attempts"] == 3 and r["last_status_code"] == 503 for r in failed)
    assert "c-a" not in receiver.types_by_call()
    receiver.fail_call = None
    for row in reversed(failed):  # redelivered oldest first: they arrive in the call's order
        answer = await plane.client.post(f"/v1/webhooks/deliveries/{row['id']}/redeliver")
        assert answer.status_code == 200
    await receiver.wait_for(lambda r: r.types_by_call().get("c-a") == EXPECTED, within=20)


async def test_the_feed_keeps_its_events_in_order_while_the_database_is_down(database_url: str) -> None:
    endpoint = Endpoint("app", "http://127.0.0.1:9/hooks", frozenset(WEBHOOK_EVENT_TYPES), None)
    feed = WebhookFeed([endpoint], capacity=5)
    for n in range(4):
        feed.offer("call.started", {"id": f"c-{n}", "state": "ringing"}, float(n))
    down = Database(create_engine(f"postgresql://gw@127.0.0.1:{free_ports(1)[0]}/nowhere"))
    feed.attach(down)
    try:
        with pytest.raises((OSError, SQLAlchemyError)):
            await feed.flush(batch=2)
    finally:
        await down.aclose()
    assert feed.backlog == 4
    for n in range(4, 7):  # past the capacity of 5: the oldest two go, counted
        feed.offer("call.started", {"id": f"c-{n}", "state": "ringing"}, float(n))
    assert feed.backlog == 5 and feed.dropped == 2
    database = await open_database(database_url)
    try:
        feed.attach(database)
        await feed.flush(batch=2)
        assert feed.backlog == 0
        rows, more = await list_deliveries(database, DeliveryQuery())
        assert [row.call_id for row in reversed(rows)] == [f"c-{n}" for n in range(2, 7)] and not more
    finally:
        await database.aclose()
