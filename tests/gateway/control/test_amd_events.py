"""Answering-machine detection at the control plane: POST /v1/calls takes ``amd`` (a leave-message without its
message is a 422 with the reason), and a worker's ``call.amd_detected`` report is published once on the stream
and stays in the call (GET /v1/calls/{id})."""

from __future__ import annotations

from gateway.fleet import WorkerEvent
from gateway.fleet.models import AmdLine
from tests.gateway.control.conftest import AUTH, Env

TO = "sip:+15550123@trunk.example.net"


async def test_originate_carries_amd_and_refuses_a_missing_message(env: Env) -> None:
    bad = await env.client.post("/v1/calls", headers=AUTH, json={"to": TO, "amd": "detect_and_leave_message"})
    assert bad.status_code == 422 and "voicemail_message" in bad.text
    unknown = await env.client.post("/v1/calls", headers=AUTH, json={"to": TO, "amd": "maybe"})
    assert unknown.status_code == 422
    assert env.worker.originated == []
    body = {"to": TO, "caller_id": "+15550201", "amd": "detect_and_leave_message", "voicemail_message": "Call back."}
    response = await env.client.post("/v1/calls", headers=AUTH, json=body)
    assert response.status_code == 201, response.text
    request, _ = env.worker.originated[0]
    assert (request.amd, request.voicemail_message) == ("detect_and_leave_message", "Call back.")


async def test_an_amd_report_publishes_one_event_and_stays_in_the_call(env: Env) -> None:
    decision = await env.worker.place_call("+15550199")
    mark = await env.plane.store.last_event_id()
    amd = AmdLine(result="machine", reason="long_greeting", at_s=2.3)
    call = env.worker.calls[decision.call_id].model_copy(update={"amd": amd})
    env.worker.calls[call.id] = call
    assert env.worker.link is not None
    await env.worker.link.report(
        [WorkerEvent(type="call.amd_detected", worker="worker-a", time=env.clock(), call=call)]
    )

    events, _, _ = await env.plane.events_since(mark)
    assert [e.type for e in events] == ["call.updated", "call.amd_detected"]
    assert events[1].data == {
        "call_id": call.id,
        "result": "machine",
        "reason": "long_greeting",
        "at_s": 2.3,
        "beep_at_s": None,
    }
    view = (await env.client.get(f"/v1/calls/{call.id}", headers=AUTH)).json()
    assert view["amd"] == {"result": "machine", "reason": "long_greeting", "at_s": 2.3, "beep_at_s": None}
