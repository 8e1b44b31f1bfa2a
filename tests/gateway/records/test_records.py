"""A call's record is written and read back whole, on SQLite and PostgreSQL; retention deletes old records only."""

from __future__ import annotations

import sqlalchemy as sa

from gateway.fleet.models import ReferralLine
from gateway.records import RetentionJob, open_database
from gateway.records.history import get_record, write_records
from tests.gateway.records.conftest import ended_call

DAY = 86_400.0


async def test_a_record_is_read_back_with_every_field(database_url: str) -> None:
    database = await open_database(database_url)
    try:
        call = ended_call("c-full")
        await write_records(database, [(call, "support")], now=call.ended or 0.0)
        record = await get_record(database, "c-full")
        assert record is not None
        assert record.profile == "support" and record.recording_path is None
        # Everything the snapshot said comes back, its caller context too.
        assert record.model_dump(exclude={"profile", "recording_path"}) == call.model_dump()
        assert record.context is not None and record.context.headers == {"X-Account": "42"}
        assert [line.truncated for line in record.transcript] == [False, False, True]
        assert record.transcript[1].start_s == 2.4 and record.transcript[1].end_s == 4.8
        assert record.tools[0].arguments == '{"order": "A-17"}' and record.tools[0].duration_ms == 182.0
        assert record.dtmf == "12#" and record.stats.mos == 4.31
        assert [(d.digit, d.direction, d.at_s) for d in record.dtmf_events][:2] == [
            ("1", "received", 3.0),
            ("9", "sent", 3.5),
        ]
        assert record.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736" and record.stats.handoffs == 1
        assert record.amd is not None and (record.amd.result, record.amd.beep_at_s) == ("machine", 7.5)
        assert record.trunk == "carrier_a"
        assert await get_record(database, "c-none") is None
    finally:
        await database.aclose()


async def test_a_call_of_no_trunk_and_its_referrals_trunks_are_read_back(database_url: str) -> None:
    database = await open_database(database_url)
    try:
        referral = ReferralLine(at_s=3.0, target="tel:+15550111", outcome="failed", status=486, trunk="carrier_b")
        call = ended_call("c-untrunked", trunk=None).model_copy(update={"referrals": [referral]})
        await write_records(database, [(call, "support")], now=call.ended or 0.0)
        record = await get_record(database, "c-untrunked")
        assert record is not None and record.trunk is None
        assert [(r.target, r.trunk) for r in record.referrals] == [("tel:+15550111", "carrier_b")]
    finally:
        await database.aclose()


async def test_a_second_end_replaces_the_record_whole(database_url: str) -> None:
    database = await open_database(database_url)
    try:
        lost = ended_call("c-twice", end_reason="worker_lost")
        await write_records(database, [(lost, "support")], now=1.0)
        own = ended_call("c-twice", end_reason="caller_hangup", said="Second version of the call")
        own = own.model_copy(update={"transcript": own.transcript[:2], "tools": []})
        await write_records(database, [(own, "support")], now=2.0)
        record = await get_record(database, "c-twice")
        assert record is not None and record.end_reason == "caller_hangup"
        assert [line.text for line in record.transcript] == ["Hi, how can I help?", "Second version of the call"]
        assert record.tools == []
    finally:
        await database.aclose()


async def test_retention_deletes_the_records_that_ended_before_the_window(database_url: str) -> None:
    now = 1_767_225_600.0
    database = await open_database(database_url)
    try:
        calls = [
            ended_call("c-old", started=now - 40 * DAY),
            ended_call("c-edge", started=now - 30 * DAY + 60),
            ended_call("c-new", started=now - DAY),
        ]
        await write_records(database, [(c, "support") for c in calls], now=now)
        job = RetentionJob(database, retention_days=30, clock=lambda: now)
        assert await job.sweep() == 1
        assert await job.sweep() == 0
        async with database.engine.connect() as connection:
            kept = (await connection.execute(sa.text("SELECT id FROM calls ORDER BY id"))).scalars().all()
            items = (await connection.execute(sa.text("SELECT DISTINCT call_id FROM transcript_items"))).scalars()
            tools = (await connection.execute(sa.text("SELECT DISTINCT call_id FROM tool_calls"))).scalars()
            assert set(items.all()) == set(tools.all()) == {"c-edge", "c-new"}
        assert kept == ["c-edge", "c-new"]
    finally:
        await database.aclose()
