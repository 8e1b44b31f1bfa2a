"""Fixtures for the database of calls: each test gets a fresh database on each engine, SQLite (a file) and a real
PostgreSQL server (started once per module; see tests/support/postgres.py)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest

from gateway.fleet.models import CallSnapshot, CallStats, ToolCallLine, TranscriptLine
from tests.support.postgres import PostgresServer

_NAMES = itertools.count(1)


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer(name="records")
    try:
        server.start()
        yield server
    finally:
        server.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty database of calls on each engine."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'calls.db'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.create_database(f"records_{next(_NAMES)}")


def ended_call(
    call_id: str,
    *,
    started: float = 1_767_225_600.0,
    duration_s: float = 30.0,
    caller: str = "+15550100",
    called: str = "+15550199",
    route: str = "support",
    worker: str = "worker-a",
    direction: str = "inbound",
    end_reason: str = "caller_hangup",
    said: str = "Hello, I would like to check my order status",
    trunk: str | None = "carrier_a",
) -> CallSnapshot:
    """An ended call with every field the record keeps filled in."""
    return CallSnapshot.model_validate(
        {
            "id": call_id,
            "direction": direction,
            "kind": "sip",
            "from": caller,
            "to": called,
            "route": route,
            "provider": "echo",
            "state": "ended",
            "worker": worker,
            "codec": "PCMU",
            "srtp": "AES_CM_128_HMAC_SHA1_80",
            "transport": "tls",
            "trunk": trunk,
            "cost": 1.0,
            "started": started,
            "answered": started + 0.5,
            "ended": started + 0.5 + duration_s,
            "duration_s": duration_s,
            "end_reason": end_reason,
            "stats": CallStats(
                rtp_packets_in=1500,
                rtp_packets_out=1490,
                rtp_lost=3,
                loss_pct=0.2,
                jitter_ms=3.25,
                late=1,
                rtt_ms=12.5,
                concealed=4,
                underruns=1,
                mos=4.31,
                provider_latency_p50_ms=420.0,
                provider_latency_last_ms=380.5,
                barge_ins=2,
                resumes=1,
                tool_calls=1,
                agent_audio_gaps=0,
                handoffs=1,
            ),
            "transcript": [
                TranscriptLine(role="assistant", text="Hi, how can I help?", start_s=0.6, end_s=1.9),
                TranscriptLine(role="user", text=said, start_s=2.4, end_s=4.8),
                TranscriptLine(
                    role="assistant", text="Let me look that up for y", start_s=5.1, end_s=6.0, truncated=True
                ),
            ],
            "tools": [
                ToolCallLine(
                    name="order_status",
                    arguments='{"order": "A-17"}',
                    result='{"status": "shipped"}',
                    start_s=5.2,
                    duration_ms=182.0,
                )
            ],
            "dtmf": "12#",
            "dtmf_events": [
                {"digit": "1", "direction": "received", "at_s": 3.0},
                {"digit": "9", "direction": "sent", "at_s": 3.5},
                {"digit": "2", "direction": "received", "at_s": 4.0},
                {"digit": "#", "direction": "received", "at_s": 4.25},
            ],
            "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
            "amd": {"result": "machine", "reason": "long_greeting", "at_s": 2.32, "beep_at_s": 7.5},
            "context": {
                "caller_number": caller,
                "caller_name": "Ada",
                "identity_source": "p-asserted-identity",
                "called_number": called,
                "headers": {"X-Account": "42"},
                "transport": "tls",
            },
        }
    )
