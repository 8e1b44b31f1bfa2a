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
from tests.e2e.provider_harness import caller_wav, only_call, start_fake_provider, start_gateway_on_fake
from tests.support.baresip import BaresipPhone
from tests.support.fixtures import require_speech_tools
from tests.support.peers import require_binary
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


@pytest.mark.peer
async def test_a_barged_in_call_with_dtmf_leaves_its_items_times_and_digits(
    tmp_path: Path, database_env: dict[str, str]
) -> None:
    """baresip presses a key, speaks, and cuts into the agent's long (paced) reply from the fake OpenAI provider:
    the record has the digit with its time, the cut item marked truncated with its end, and the barge-in counted."""
    require_binary("baresip", package="baresip baresip-core")
    require_speech_tools()
    async with ProcessGroup(tmp_path / "logs") as procs:
        fake = await start_fake_provider(procs, "--mode", "tone", "--reply-ms", "6000", "--paced", "--chunk-ms", "100")
        gateway = await start_gateway_on_fake(procs, tmp_path, fake, env=database_env)
        source = caller_wav(
            tmp_path / "caller.wav", [1.0, "Wait, one more thing please.", 1.9, "My order number is four."]
        )
        phone = BaresipPhone(procs, tmp_path, source_wav=source, codecs=("pcmu",), tail_silence=1.0)
        async with phone:
            await phone.dial(gateway.sip_uri)
            await phone.wait_established(within=15)
            await phone.send_dtmf("5")
            await phone.wait_closed(within=40)
        call = await _until_written(gateway)

    assert call["dtmf"] == "5"
    ((digit, direction, at_s),) = [(d["digit"], d["direction"], d["at_s"]) for d in call["dtmf_events"]]
    assert (digit, direction) == ("5", "received") and 0 <= at_s < 3
    assert call["stats"]["barge_ins"] >= 1
    agent = [line for line in call["transcript"] if line["role"] == "assistant"]
    cut = [line for line in agent if line["truncated"]]
    assert cut, json.dumps(call["transcript"], indent=1)
    assert len(cut) == call["stats"]["barge_ins"], "each barge-in cut one agent item"
    for line in cut:
        # Its text is what the caller heard as far as the provider says: the fake sends its words only after the
        # whole audio, so for a cut item the adapter knows none ("").
        assert line["end_s"] is not None and line["start_s"] <= line["end_s"] < call["duration_s"] + 1
    for line in call["transcript"]:
        if line["end_s"] is not None:
            assert line["start_s"] is not None and line["start_s"] <= line["end_s"], line


async def _until_written(gateway: GatewayProcess) -> dict[str, Any]:
    """The ended call's whole record, once it is in the database (not only in the writer's backlog)."""
    deadline = time.monotonic() + 20
    while True:
        call = await only_call(gateway)
        if call["state"] == "ended" or time.monotonic() > deadline:
            return call
        await asyncio.sleep(0.2)
