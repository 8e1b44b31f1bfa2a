"""``/internal/v1`` with a worker of a newer version: fields the plane does not know are ignored (and logged once per
worker), fields it knows are still checked; the public API's requests stay strict."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from tests.gateway.control.conftest import AUTH, Env

HEARTBEAT = "/internal/v1/workers/worker-a/heartbeat"


def _newer_call(call_id: str) -> dict[str, Any]:
    """A call as a newer worker sends it: every field this version knows, and some it does not."""
    return {
        "id": call_id,
        "state": "active",
        "route": "support",
        "from": "+15550100",
        "to": "+15550199",
        "codec": "PCMU",
        "started": 1767225600.0,
        "answered": 1767225600.5,
        "archive": {"enabled": True, "uri": "s3://bucket/c"},  # unknown to this version
        "stats": {"rtp_packets_in": 50, "mos": 4.2, "dtx_frames": 3},  # dtx_frames: unknown
        "transcript": [{"role": "user", "text": "Hello", "confidence": 0.9}],  # confidence: unknown
    }


def _newer_heartbeat(*calls: dict[str, Any], capacity: Any = 10) -> dict[str, Any]:
    info = {"id": "worker-a", "capacity": capacity, "active_calls": len(calls), "version": "9.9.0", "zone": "eu-1"}
    return {"info": info, "calls": list(calls), "sent_at": 1767225600.0}


async def test_a_newer_workers_heartbeat_is_taken_and_the_worker_stays_up(
    env: Env, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.control.plane")
    body = _newer_heartbeat(_newer_call("c-new-1"))
    for _ in range(5):  # 10 s of heartbeats, past the 6 s after which a silent worker is lost
        response = await env.client.post(HEARTBEAT, headers=AUTH, json=body)
        assert response.status_code == 200, response.text
        assert response.json()["status"] == "up"
        env.clock.advance(2.0)
        await env.plane.sweep()
    assert (await env.plane.get_worker("worker-a")).status == "up"
    call = (await env.client.get("/v1/calls/c-new-1", headers=AUTH)).json()
    assert (call["state"], call["stats"]["mos"], call["transcript"]) == (
        "active",
        4.2,
        [{"role": "user", "text": "Hello", "start_s": None, "end_s": None, "truncated": False}],
    )
    assert "archive" not in call and "dtx_frames" not in call["stats"]  # what the plane does not know, it drops
    skew = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert skew == [
        "worker worker-a (version 9.9.0) sends fields this control plane does not know; they are ignored until the "
        "plane is updated too: calls.archive, calls.stats.dtx_frames, calls.transcript.confidence, info.zone, sent_at"
    ]  # once, not once per heartbeat

    # The worker updated again and sends something else new: said again.
    call = _newer_call("c-new-1") | {"sip_trace": "x"}
    response = await env.client.post(HEARTBEAT, headers=AUTH, json=_newer_heartbeat(call))
    assert response.status_code == 200
    skew = [r.getMessage() for r in caplog.records if "does not know" in r.getMessage()]
    assert len(skew) == 2 and skew[-1].endswith(
        "calls.sip_trace, calls.stats.dtx_frames, calls.transcript.confidence, info.zone, sent_at"
    )


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"capacity": "many"}, "info.capacity: Input should be a valid integer"),
        ({"call_cost": "lots"}, "calls.0.cost: Input should be a valid number"),
        ({"call_state": "dancing"}, "calls.0.state: Input should be 'admitted', 'ringing'"),
        ({"no_id": True}, "info.id: Field required"),
        ({"negative_used": True}, "info.used: Input should be greater than or equal to 0"),
    ],
)
async def test_a_known_field_that_is_wrong_is_refused_naming_it_and_only_it(
    env: Env, change: dict[str, Any], named: str
) -> None:
    call = _newer_call("c-bad")
    body = _newer_heartbeat(call, capacity=change.get("capacity", 10))
    if "call_cost" in change:
        call["cost"] = change["call_cost"]
    if "call_state" in change:
        call["state"] = change["call_state"]
    if "no_id" in change:
        del body["info"]["id"]
    if "negative_used" in change:
        body["info"]["used"] = -1.0
    mark = await env.plane.store.last_event_id()
    response = await env.client.post(HEARTBEAT, headers=AUTH, json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "validation_error" and named in error["message"], error
    for unknown in ("archive", "dtx_frames", "zone", "sent_at"):
        assert unknown not in error["message"]  # the fields it ignores are not what is wrong
    assert await env.plane.store.last_event_id() == mark  # nothing of the refused heartbeat was taken
    assert await env.plane.store.get_call("c-bad") is None


async def test_a_heartbeat_that_is_not_json_is_refused(env: Env) -> None:
    response = await env.client.post(
        HEARTBEAT, headers={**AUTH, "content-type": "application/json"}, content=b'{"info": {"id": "worker-a"'
    )
    assert response.status_code == 422
    assert response.json()["error"]["message"].startswith("body: Invalid JSON: EOF while parsing")


async def test_register_admit_and_events_of_a_newer_worker_are_taken(env: Env) -> None:
    info = {"id": "worker-n", "url": "http://127.0.0.1:9", "capacity": 5, "version": "9.9.0", "zone": "eu-1"}
    response = await env.client.post("/internal/v1/workers/register", headers=AUTH, json=info)
    assert response.status_code == 200 and response.json()["status"] == "up"
    admission = {"called": "+15550201", "worker": "worker-n", "cost": 1.0, "codec_hint": "opus"}
    decision = (await env.client.post("/internal/v1/admit", headers=AUTH, json=admission)).json()
    assert decision["accepted"] and decision["worker"] in ("worker-a", "worker-n")
    call = _newer_call(decision["call_id"]) | {"route": "sales"}
    event = {"type": "call.started", "worker": "worker-n", "time": 1767225601.0, "call": call, "seq": 7}
    response = await env.client.post("/internal/v1/events", headers=AUTH, json={"events": [event]})
    assert response.status_code == 204, response.text
    stored = await env.plane.get_call(decision["call_id"])
    assert (stored.state, stored.worker, stored.stats.mos) == ("active", "worker-n", 4.2)
    bad = {"events": [event | {"time": "yesterday"}]}
    response = await env.client.post("/internal/v1/events", headers=AUTH, json=bad)
    assert response.status_code == 422 and "events.0.time" in response.json()["error"]["message"]


async def test_the_public_api_still_refuses_fields_it_does_not_know(env: Env) -> None:
    response = await env.client.post(
        "/v1/calls", headers=AUTH, json={"to": "+15550123", "route": "support", "ringtone": "classic"}
    )
    assert response.status_code == 422
    assert "ringtone: Extra inputs are not permitted" in response.json()["error"]["message"]
    response = await env.client.post(
        "/v1/workers/worker-a/drain", headers=AUTH, json={"exit_when_empty": True, "force": True}
    )
    assert response.status_code == 422 and "force" in response.json()["error"]["message"]
    assert (await env.plane.get_worker("worker-a")).status == "up"
