"""Event webhooks across a control-plane restart while the receiving application is down: ``gateway run`` (a real
process) with the echo agent takes two calls from the load tester's SIP callers while the receiver refuses
connections, is stopped and started again on the same database of calls (SQLite, and a real PostgreSQL server),
and only then does the receiver come up (failing a few requests on purpose). Every event arrives once after
de-duplication by ``webhook-id``, signed, in order per call. And a baresip call to the echo agent reaches an
application subscribed in the routes file: call.started and call.ended (and call.recording_ready once recordings are
on main) once each, signed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.fleet.models import CallSnapshot
from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.e2e.ops_support import poll
from tests.e2e.test_call_records import DIALLED, _call, database_env
from tests.support.baresip import BaresipPhone
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup
from tests.support.webhook_receiver import WebhookReceiver

__all__ = ["database_env"]  # the fixture: SQLite, or a real PostgreSQL server

pytestmark = pytest.mark.timeout(180)

SECRET = "whsec_ZTJlLXdlYmhvb2tzLXNlY3JldC0wMTIzNDU2Nzg5YWJjZGVm"
EXPECTED = ["call.started", "call.answered", "call.transcript", "call.ended"]


async def _deliveries(gateway: GatewayProcess, **params: Any) -> list[dict[str, Any]]:
    page = await gateway.api("GET", "/v1/webhooks/deliveries", params={"limit": 500, **params})
    items: list[dict[str, Any]] = page["items"]
    return items


async def test_no_event_is_lost_across_a_restart_while_the_receiver_is_down(
    tmp_path: Path, database_env: dict[str, str]
) -> None:
    receiver = WebhookReceiver(SECRET)  # not started: its port refuses connections
    env = {
        **database_env,
        "GATEWAY_EVENT_WEBHOOK_URL": receiver.url,
        "GATEWAY_WEBHOOK_SECRET": SECRET,
        "GATEWAY_EVENT_WEBHOOK_BACKOFF_MIN_S": "0.2",
        "GATEWAY_EVENT_WEBHOOK_BACKOFF_MAX_S": "1.0",
        "GATEWAY_EVENT_WEBHOOK_MAX_ATTEMPTS": "1000",
    }
    async with ProcessGroup(tmp_path / "logs") as procs:
        gateway = await start_gateway(procs, env=env, lifetime=120)
        summary = await _call(procs, gateway, tmp_path / "load.json")
        assert summary["answered"] == 2, summary["statuses"]

        async def both_waiting() -> list[dict[str, Any]] | None:
            # Both calls' ends are in the outbox, and their first events were refused.
            rows = await _deliveries(gateway)
            ended = [row for row in rows if row["type"] == "call.ended"]
            refused = [row for row in rows if row["attempts"] >= 1 and "Connect" in row["last_error"]]
            return rows if len(ended) == 2 and len(refused) >= 2 else None

        rows = await poll(both_waiting, within=30, what="both calls' events waiting for the receiver", every=0.2)
        assert all(row["status"] == "pending" for row in rows)
        calls = sorted({row["call_id"] for row in rows})
        assert len(calls) == 2
        await gateway.process.terminate(grace=15.0)

        again = await start_gateway(procs, env=env, lifetime=90, name="gateway-again")
        receiver.fail_next = 3
        async with receiver:
            await receiver.wait_for(lambda r: all(len(r.types_by_call().get(c, [])) == 4 for c in calls), within=40)
            assert receiver.rejected == [] and receiver.failed == 3
            assert receiver.types_by_call() == {call_id: EXPECTED for call_id in calls}
            unique = receiver.unique()
            assert len(unique) == 8
            for item in unique.values():
                assert item.data["call_id"] in calls
                if item.type == "call.ended":
                    assert item.data["end_reason"] and item.data["to"].endswith(DIALLED)
                if item.type == "call.transcript":
                    assert any("pressed 7" in line["text"] for line in item.data["items"])
            rows = await _deliveries(again)
            assert {row["webhook_id"] for row in rows} == set(unique)
            assert max(row["attempts"] for row in rows) >= 2  # tried before the restart and after it


# Recordings are another helper's work: with CallSnapshot.recording on main, the call is recorded and its
# call.recording_ready is expected too (the route's `record` setting, from that work).
RECORDING_ON_MAIN = "recording" in CallSnapshot.model_fields


@pytest.mark.peer
async def test_a_baresip_call_reaches_the_application_signed_and_once(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    receiver = WebhookReceiver(SECRET)
    record = 'record = "both"\n' if RECORDING_ON_MAIN else ""
    config = tmp_path / "routes.toml"
    config.write_text(
        '[[routes]]\nname = "default"\ndid = "*"\nprofile = "echo"\n\n'
        f'[profiles.echo]\nprovider = "default"\ngreeting = ""\n{record}\n'
        f'[[webhooks]]\nname = "app"\nurl = "{receiver.url}"\n'
        'events = ["call.started", "call.ended", "call.recording_ready"]\n'
    )
    expected = ["call.started", "call.ended", *(["call.recording_ready"] if RECORDING_ON_MAIN else [])]
    async with receiver:
        receiver.fail_next = 1  # the first request fails: its retry carries the same webhook-id
        gateway = await start_gateway(
            peer_procs,
            env={
                "GATEWAY_CONFIG": str(config),
                "GATEWAY_WEBHOOK_SECRET": SECRET,
                "GATEWAY_EVENT_WEBHOOK_BACKOFF_MIN_S": "0.2",
            },
        )
        phone = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, codecs=("pcmu",), tail_silence=1.0)
        async with phone:
            await phone.dial(gateway.sip_uri)
            await phone.wait_established(within=15)
            await phone.wait_closed(within=40)
        await receiver.wait_for(lambda r: len(r.unique()) == len(expected), within=30)
        (call_id,) = receiver.types_by_call()
        assert receiver.types_by_call() == {call_id: expected} and receiver.rejected == []
        assert receiver.failed == 1 and len(receiver.received) == len(expected)
        started, ended = (item for item in receiver.unique().values() if item.type in ("call.started", "call.ended"))
        assert started.data["kind"] == "sip" and started.data["direction"] == "inbound"
        assert ended.data["end_reason"] == "caller_hangup" and ended.data["duration_s"] > 1.0
        assert ended.data["stats"]["rtp_packets_in"] > 100
        rows = await _deliveries(gateway, call_id=call_id)
        assert sorted(row["type"] for row in rows) == sorted(expected)
        assert all(row["status"] == "delivered" for row in rows)
