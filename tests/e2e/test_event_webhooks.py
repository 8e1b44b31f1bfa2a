"""Event webhooks across a control-plane restart while the receiving application is down: ``gateway run`` (a real
process) with the echo agent takes two calls from the load tester's SIP callers while the receiver refuses
connections, is stopped and started again on the same database of calls (SQLite, and a real PostgreSQL server),
and only then does the receiver come up (failing a few requests on purpose). Every event arrives once after
de-duplication by ``webhook-id``, signed, in order per call."""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.e2e.ops_support import poll
from tests.e2e.test_call_records import DIALLED, _call, database_env
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
    tmp_path: Any, database_env: dict[str, str]
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
