"""The schema is migrated at start-up, from empty or from the previous revision, on SQLite and PostgreSQL; a
database a newer gateway migrated is refused, untouched, with a message that says what to do."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from gateway.records import DatabaseTooNewError, open_database
from gateway.records.database import create_engine, known_revisions
from gateway.records.schema import metadata
from tests.support.procs import free_ports

HEAD = "0010_trunkrec_call_trunk"


def _columns(connection: sa.Connection) -> dict[str, set[str]]:
    inspector = sa.inspect(connection)
    return {table: {c["name"] for c in inspector.get_columns(table)} for table in inspector.get_table_names()}


def _old_call(call_id: str) -> sa.TextClause:
    """An INSERT of an ended call, in the columns of the old revisions these tests start from."""
    return sa.text(
        "INSERT INTO calls (id, direction, kind, from_number, to_number, route, profile, provider, worker,"
        " started_at, ended_at, duration_s, end_reason, codec, transport, srtp, cost, jitter_ms, loss_pct,"
        " concealed, barge_ins, resumes, tool_call_count, stats, dtmf, written_at) VALUES (:id,"
        " 'inbound', 'sip', '+15550100', '+15550199', 'support', 'support', 'echo', 'w', 1.0, 2.0, 1.0,"
        " 'caller_hangup', 'PCMU', 'udp', '', 1.0, 0.0, 0.0, 0, 0, 0, 0, '{}', '', 2.0)"
    ).bindparams(id=call_id)


async def test_an_empty_database_is_migrated_to_the_schema_the_code_uses(database_url: str) -> None:
    database = await open_database(database_url)
    try:
        assert await database.revision() == HEAD == known_revisions()[1]
        async with database.engine.connect() as connection:
            found = await connection.run_sync(_columns)
        expected = {table.name: {c.name for c in table.columns} for table in metadata.sorted_tables}
        assert {name: found[name] for name in expected} == expected
        assert set(found) == {*expected, "alembic_version"}
    finally:
        await database.aclose()
    again = await open_database(database_url)  # a second start finds it current and changes nothing
    try:
        assert await again.revision() == HEAD
    finally:
        await again.aclose()


async def test_a_database_at_the_previous_revision_is_migrated_keeping_its_rows(database_url: str) -> None:
    old = await open_database(database_url, target="0001_calls")
    try:
        assert await old.revision() == "0001_calls"
        async with old.engine.begin() as connection:
            assert "transcript_items" not in await connection.run_sync(_columns)
            await connection.execute(_old_call("c-old"))
    finally:
        await old.aclose()
    database = await open_database(database_url)
    try:
        assert await database.revision() == HEAD
        async with database.engine.connect() as connection:
            ids = (await connection.execute(sa.text("SELECT id FROM calls"))).scalars().all()
            assert "transcript_items" in await connection.run_sync(_columns)
        assert ids == ["c-old"]
    finally:
        await database.aclose()


def _trunk_schema(connection: sa.Connection) -> tuple[dict[str, object], list[str]]:
    inspector = sa.inspect(connection)
    column = next(c for c in inspector.get_columns("calls") if c["name"] == "trunk")
    indexes = [i for i in inspector.get_indexes("calls") if i["name"] == "ix_calls_trunk"]
    return column, [str(name) for index in indexes for name in index["column_names"]]


async def test_a_database_before_trunks_gains_the_nullable_indexed_column_its_calls_null(database_url: str) -> None:
    old = await open_database(database_url, target="0009_referin_call_referrals")
    try:
        async with old.engine.begin() as connection:
            assert "trunk" not in (await connection.run_sync(_columns))["calls"]
            await connection.execute(_old_call("c-before"))
    finally:
        await old.aclose()
    database = await open_database(database_url)
    try:
        assert await database.revision() == HEAD
        async with database.engine.connect() as connection:
            column, indexed = await connection.run_sync(_trunk_schema)
            rows = (await connection.execute(sa.text("SELECT id, trunk FROM calls"))).all()
        assert column["nullable"] is True and indexed == ["trunk", "started_at"]
        assert [tuple(row) for row in rows] == [("c-before", None)]
    finally:
        await database.aclose()


async def _stamp_future(database_url: str) -> None:
    database = await open_database(database_url)
    try:
        async with database.engine.begin() as connection:
            await connection.execute(sa.text("UPDATE alembic_version SET version_num = '0099_from_the_future'"))
    finally:
        await database.aclose()


async def test_a_database_newer_than_the_code_is_refused_and_left_alone(database_url: str) -> None:
    await _stamp_future(database_url)
    with pytest.raises(DatabaseTooNewError) as refused:
        await open_database(database_url)
    assert refused.value.revision == "0099_from_the_future"
    assert "newer gateway migrated it" in str(refused.value) and HEAD in str(refused.value)
    engine = create_engine(database_url)
    try:
        async with engine.connect() as connection:
            stamped = (await connection.execute(sa.text("SELECT version_num FROM alembic_version"))).scalar_one()
    finally:
        await engine.dispose()
    assert stamped == "0099_from_the_future"


async def test_the_control_plane_refuses_to_start_on_a_newer_database(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'calls.db'}"
    await _stamp_future(url)
    (port,) = free_ports(1)
    env = {**os.environ, "GATEWAY_DATABASE_URL": url, "GATEWAY_HTTP_PORT": str(port)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "control", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, stderr_bytes = await asyncio.wait_for(process.communicate(), timeout=60)
    stderr = stderr_bytes.decode()
    assert process.returncode != 0
    assert "cannot start" in stderr and "'0099_from_the_future'" in stderr, stderr[-2000:]
    assert "a newer gateway migrated it" in stderr
