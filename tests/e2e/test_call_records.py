"""A real call ends and its record is found by the history API's filters: ``gateway run`` with the echo agent,
the load tester's synthetic SIP callers, the database of calls on SQLite (the default file) and on a real
PostgreSQL server. After a restart of the gateway the records are still there (ended calls live in the database)."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.support.postgres import PostgresServer
from tests.support.procs import ProcessGroup

pytestmark = pytest.mark.timeout(180)

DIALLED = "15550142"


@pytest.fixture(params=["sqlite", "postgresql"])
def database_env(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, str]]:
    if request.param == "sqlite":
        yield {"GATEWAY_STATE_DIR": str(tmp_path / "state")}
        return
    with PostgresServer(name="e2e-records") as postgres:
        yield {"GATEWAY_DATABASE_URL": postgres.create_database("calls")}


async def _call(procs: ProcessGroup, gateway: GatewayProcess, report: Path) -> dict[str, Any]:
    rtp = f"{gateway.rtp_range[1] + 1000}-{gateway.rtp_range[1] + 1199}"
    argv = [sys.executable, "-m", "gateway", "loadtest", "--target", f"127.0.0.1:{gateway.sip_port}"]
    argv += ["--user", DIALLED, "--calls", "2", "--cps", "4", "--duration", "4", "--dtmf", "7", "--rtp-ports", rtp]
    load = await procs.start("loadtest", [*argv, "--no-analysis", "--json", str(report)], lifetime=60)
    assert await load.wait(within=60) == 0, load.output
    summary: dict[str, Any] = json.loads(await asyncio.to_thread(report.read_text))
    return summary


async def test_an_ended_call_is_found_by_the_history_filters(tmp_path: Path, database_env: dict[str, str]) -> None:
    began = time.time()
    async with ProcessGroup(tmp_path / "logs") as procs:
        gateway = await start_gateway(procs, env=database_env, lifetime=120)
        summary = await _call(procs, gateway, tmp_path / "load.json")
        assert summary["answered"] == 2, summary["statuses"]
        filters = {"number": DIALLED, "direction": "inbound", "live": "false", "since": began, "profile": "echo"}
        page = await gateway.api("GET", "/v1/calls", params=filters)
        # The end reaches the plane with the worker's report, the record the database a moment later: both are
        # listed at once (waiting records are read from the backlog), so no wait is needed here.
        assert page["total"] == 2, page
        call = page["items"][0]
        assert call["to"].endswith(DIALLED) and call["state"] == "ended" and call["end_reason"]
        assert call["stats"]["rtp_packets_in"] > 100 and call["stats"]["mos"] is not None
        assert call["codec"] == "PCMU" and call["route"] and call["profile"] == "echo"
        reason = call["end_reason"]
        assert (await gateway.api("GET", "/v1/calls", params={**filters, "end_reason": reason}))["total"] == 2
        assert (await gateway.api("GET", "/v1/calls", params={**filters, "end_reason": "nope"}))["total"] == 0
        assert (await gateway.api("GET", "/v1/calls", params={**filters, "direction": "outbound"}))["total"] == 0
        # The key each caller pressed is in its transcript (the session writes it there), found by the text filter.
        said = await gateway.api("GET", "/v1/calls", params={**filters, "text": "caller PRESSED 7"})
        assert said["total"] == 2
        assert (await gateway.api("GET", "/v1/calls", params={**filters, "text": "pressed 9"}))["total"] == 0
        await gateway.process.terminate(grace=15.0)

        again = await start_gateway(procs, env=database_env, lifetime=60, name="gateway-again")
        page = await again.api("GET", "/v1/calls", params=filters)
        assert page["total"] == 2 and {item["id"] for item in page["items"]} >= {call["id"]}
        whole = await again.api("GET", f"/v1/calls/{call['id']}")
        assert whole["end_reason"] == reason and whole["stats"]["rtp_packets_in"] == call["stats"]["rtp_packets_in"]
        pressed = [line for line in whole["transcript"] if "pressed 7" in line["text"]]
        assert len(pressed) == 1 and pressed[0]["role"] == "user" and 0 < pressed[0]["start_s"] < 10
        # The digit with its time (received), beside the transcript's text.
        assert [(d["digit"], d["direction"]) for d in whole["dtmf_events"]] == [("7", "received")]
        assert whole["dtmf"] == "7" and 0 < whole["dtmf_events"][0]["at_s"] < 10
        assert whole["stats"]["handoffs"] == 0 and "trace_id" in whole
        async with again.client() as client:
            export = await client.get("/v1/calls/export", params={"format": "csv", "number": DIALLED})
        assert export.status_code == 200 and export.text.count("\n") == 3 and call["id"] in export.text
