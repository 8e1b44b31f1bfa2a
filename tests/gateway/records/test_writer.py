"""Records are written off the call path: a database that is down (a real PostgreSQL server stopped mid-test) is
buffered and retried, counted in the metrics, affects no call, and catches up with no record lost when it returns;
a full backlog drops its oldest record, counted and logged."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import httpx
import pytest

from gateway.control.app import create_app
from gateway.control.plane import ControlPlane
from gateway.control.settings import ControlSettings
from gateway.fleet.models import CallSnapshot, WorkerEvent
from gateway.observability import REGISTRY
from gateway.records import RecordWriter
from tests.gateway.control.conftest import AUTH, TOKEN, make_config
from tests.gateway.records.conftest import ended_call
from tests.support.postgres import PostgresServer

T0 = 1_767_225_600.0


def metric(name: str) -> float:
    value = REGISTRY.get_sample_value(name)
    return value if value is not None else 0.0


async def until(condition: object, *, within: float, what: str) -> None:
    deadline = time.monotonic() + within
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s: {what}")
        await asyncio.sleep(0.05)


async def _end(plane: ControlPlane, call: CallSnapshot) -> float:
    """Report a call's end as its worker would; how long the report took."""
    began = time.monotonic()
    await plane.report([WorkerEvent(type="call.ended", worker=call.worker, time=call.ended or 0.0, call=call)])
    return time.monotonic() - began


async def test_a_database_down_mid_run_is_caught_up_with_no_record_lost() -> None:
    with PostgresServer(name="records-down") as postgres:
        url = postgres.create_database("calls")
        app = create_app(
            ControlSettings(api_token=TOKEN, database_url=url, retention_days=0), config=make_config(), sweeper=False
        )
        async with app.router.lifespan_context(app):
            plane: ControlPlane = app.state.plane
            writer: RecordWriter = app.state.history.writer
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://control.test", headers=AUTH) as client:
                for n in range(5):
                    await _end(plane, ended_call(f"c-before-{n}", started=T0 + n))
                assert await writer.flush(30)
                failures_before = metric("gateway_db_write_failures_total")

                postgres.stop(mode="immediate")  # as if it crashed
                slowest = 0.0
                for n in range(20):
                    slowest = max(slowest, await _end(plane, ended_call(f"c-during-{n}", started=T0 + 100 + n)))
                assert slowest < 0.5, f"a call's end waited {slowest:.3f} s on a database that is down"
                await until(lambda: writer.failures >= 2, within=30, what="two failed write attempts")
                assert writer.backlog == 20 and metric("gateway_db_write_backlog") == 20
                assert metric("gateway_db_write_failures_total") >= failures_before + 2
                # What waits is still readable: a call's record comes from the backlog.
                waiting = (await client.get("/v1/calls/c-during-7")).json()
                assert waiting["state"] == "ended" and waiting["transcript"][1]["text"].startswith("Hello")

                postgres.start()
                assert await writer.flush(60), f"{writer.backlog} records still unwritten"
                assert metric("gateway_db_write_backlog") == 0 and writer.dropped == 0
                page = (await client.get("/v1/calls", params={"limit": 500, "sort": "started"})).json()
                expected = [f"c-before-{n}" for n in range(5)] + [f"c-during-{n}" for n in range(20)]
                assert [item["id"] for item in page["items"]] == expected and page["total"] == 25
                record = (await client.get("/v1/calls/c-during-19")).json()
                assert record["tools"][0]["name"] == "order_status" and len(record["transcript"]) == 3


class _Gate:
    """A write function that fails while closed and records what it wrote."""

    def __init__(self) -> None:
        self.open = False
        self.written: list[str] = []

    async def __call__(self, records: Sequence[tuple[CallSnapshot, str]], now: float) -> None:
        if not self.open:
            raise ConnectionRefusedError("database down")
        self.written += [call.id for call, _ in records]


async def test_a_full_backlog_drops_its_oldest_record_counted_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    gate = _Gate()
    writer = RecordWriter(None, capacity=3, backoff_min_s=0.01, backoff_max_s=0.05, write=gate)  # type: ignore[arg-type]
    task = asyncio.create_task(writer.run(), name="test-records-writer")
    try:
        dropped_before = metric("gateway_db_records_dropped_total")
        with caplog.at_level(logging.ERROR, logger="gateway.records.writer"):
            for n in range(5):
                writer.submit(ended_call(f"c-{n}"), "support")
        assert writer.dropped == 2 and metric("gateway_db_records_dropped_total") == dropped_before + 2
        assert [r.getMessage() for r in caplog.records if "c-0 is dropped" in r.getMessage()]
        assert [call.id for call in writer.pending_calls()] == ["c-2", "c-3", "c-4"]
        # A second end of a waiting call replaces it in place: no drop, no duplicate.
        writer.submit(ended_call("c-3", end_reason="worker_lost"), "support")
        pending = writer.pending("c-3")
        assert writer.dropped == 2 and pending is not None and pending.end_reason == "worker_lost"
        await until(lambda: writer.failures >= 3, within=10, what="retries with backoff")
        gate.open = True
        assert await writer.flush(10)
        assert gate.written == ["c-2", "c-3", "c-4"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_a_plane_starts_without_its_database_and_writes_once_it_answers(caplog: pytest.LogCaptureFixture) -> None:
    with PostgresServer(name="records-late") as postgres:
        url = postgres.create_database("calls")
        postgres.stop()
        app = create_app(
            ControlSettings(api_token=TOKEN, database_url=url, retention_days=0), config=make_config(), sweeper=False
        )
        with caplog.at_level(logging.ERROR, logger="gateway.control.app"):
            async with app.router.lifespan_context(app):  # starts: calls need the plane more than their records
                plane: ControlPlane = app.state.plane
                history = app.state.history
                assert history.database is None
                await until(
                    lambda: any("cannot be opened (records wait" in r.getMessage() for r in caplog.records),
                    within=10,
                    what="the error that says records wait",
                )
                assert await _end(plane, ended_call("c-early", started=T0)) < 0.5
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://control.test", headers=AUTH) as api:
                    assert (await api.get("/v1/calls/c-early")).json()["end_reason"] == "caller_hangup"
                    postgres.start()
                    await until(lambda: history.database is not None, within=60, what="the database opened")
                    assert await history.writer.flush(30)
                    page = (await api.get("/v1/calls", params={"live": "false"})).json()
                    assert [item["id"] for item in page["items"]] == ["c-early"] and page["total"] == 1
                    assert (await api.get("/v1/calls/c-early")).json()["tools"][0]["name"] == "order_status"
