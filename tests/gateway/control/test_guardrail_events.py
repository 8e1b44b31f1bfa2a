"""A worker's ``guardrail.tripped`` report: the plane publishes one ``guardrail.tripped`` event naming the call and
the trip, and the trip stays in the call's stats (GET /v1/calls/{id}, the call's record)."""

from __future__ import annotations

from gateway.fleet import WorkerEvent
from gateway.fleet.models import CallStats, GuardrailTripLine
from tests.gateway.control.conftest import AUTH, Env


async def test_a_trip_report_publishes_one_event_and_stays_in_the_call(env: Env) -> None:
    decision = await env.worker.place_call("+15550199")
    mark = await env.plane.store.last_event_id()
    trip = GuardrailTripLine(guardrail="no-acme", reason="blocked phrase 'acme corp'", response_id="r1", heard_ms=820)
    call = env.worker.calls[decision.call_id].model_copy(update={"stats": CallStats(guardrail_trips=[trip])})
    env.worker.calls[call.id] = call
    assert env.worker.link is not None
    await env.worker.link.report(
        [WorkerEvent(type="guardrail.tripped", worker="worker-a", time=env.clock(), call=call)]
    )

    events, _, _ = await env.plane.events_since(mark)
    assert [e.type for e in events] == ["call.updated", "guardrail.tripped"]
    data = events[1].data
    assert data["call_id"] == call.id and data["guardrail"] == "no-acme" and data["heard_ms"] == 820
    view = (await env.client.get(f"/v1/calls/{call.id}", headers=AUTH)).json()
    assert view["stats"]["guardrail_trips"][0]["reason"] == "blocked phrase 'acme corp'"
