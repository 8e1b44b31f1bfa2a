"""Worker liveness with an injected clock: lost after missed heartbeats, calls ended, recovery, forgetting."""

from __future__ import annotations

from gateway.control.store import MemoryStore
from gateway.fleet import AdmissionRequest, WorkerEvent
from gateway.fleet.models import HandoffLine
from tests.gateway.control.conftest import AUTH, Env


async def _event_types(env: Env, after: int = 0) -> list[tuple[str, dict]]:
    events, _, _ = await env.plane.events_since(after)
    return [(e.type, e.data) for e in events]


async def test_silent_worker_is_lost_and_its_calls_end_with_worker_lost(env: Env) -> None:
    other = await env.add_worker("worker-b")
    decision = await env.worker.place_call("+15550199")
    survivor = await other.place_call("+15550201")
    mark = await env.plane.store.last_event_id()

    env.clock.advance(5.9)  # lost after 3 x 2 s
    await other.heartbeat()
    await env.plane.sweep()
    assert (await env.plane.get_worker("worker-a")).status == "up"

    env.clock.advance(0.2)
    await env.plane.sweep()
    assert (await env.plane.get_worker("worker-a")).status == "lost"
    assert (await env.plane.get_worker("worker-b")).status == "up"
    call = await env.plane.get_call(decision.call_id)
    assert (call.state, call.end_reason) == ("ended", "worker_lost")
    assert abs(call.duration_s - 6.1) < 1e-6
    assert (await env.plane.get_call(survivor.call_id)).state == "active"
    types = [t for t, _ in await _event_types(env, mark)]
    assert types == ["worker.updated", "worker.lost", "call.ended"]
    assert await env.plane.store.get_reservation(decision.call_id) is None

    ready = await env.client.get("/readyz")
    assert ready.json()["workers_up"] == 1


async def test_a_lost_worker_that_heartbeats_again_is_taken_back(env: Env) -> None:
    env.clock.advance(10)
    await env.plane.sweep()
    assert (await env.plane.get_worker("worker-a")).status == "lost"
    assert (await env.client.get("/readyz")).status_code == 503
    await env.worker.heartbeat()
    assert (await env.plane.get_worker("worker-a")).status == "up"
    assert (await env.client.get("/readyz")).status_code == 200


async def test_lost_workers_are_forgotten_after_forget_after(env: Env) -> None:
    env.clock.advance(10)
    await env.plane.sweep()
    env.clock.advance(61)
    await env.plane.sweep()
    workers = (await env.client.get("/v1/workers", headers=AUTH)).json()["items"]
    assert workers == []


async def test_admitted_call_missing_from_heartbeats_is_released_after_grace(env: Env) -> None:
    # The worker asked for admission but never started the call (e.g. the caller cancelled, report lost).
    decision = await env.plane.admit(AdmissionRequest(called="+15550199", worker="worker-a"))
    await env.worker.heartbeat()
    assert await env.plane.store.get_reservation(decision.call_id) is not None
    env.clock.advance(11)
    await env.worker.heartbeat()
    assert await env.plane.store.get_reservation(decision.call_id) is None
    call = await env.plane.get_call(decision.call_id)
    assert (call.state, call.end_reason) == ("ended", "vanished")


async def test_heartbeat_after_plane_restart_restores_worker_and_calls(env: Env) -> None:
    decision = await env.worker.place_call("+15550199")
    # A fresh store: the plane forgot everything (memory store, restarted process).
    env.plane.store = MemoryStore()
    await env.worker.heartbeat()
    assert (await env.plane.get_worker("worker-a")).status == "up"
    assert (await env.plane.get_call(decision.call_id)).state == "active"
    assert await env.plane.store.get_reservation(decision.call_id) is not None
    types = [t for t, _ in await _event_types(env)]
    assert types == ["worker.registered", "call.started"]


async def test_worker_gone_after_drain_ends_its_remaining_calls(env: Env) -> None:
    decision = await env.worker.place_call("+15550199")
    await env.plane.report([WorkerEvent(type="worker.gone", worker="worker-a", time=env.clock())])
    assert (await env.plane.get_worker("worker-a")).status == "gone"
    assert (await env.plane.get_call(decision.call_id)).end_reason == "worker_gone"


async def test_a_heartbeat_snapshot_older_than_the_calls_end_does_not_bring_it_back(env: Env) -> None:
    # The heartbeat's snapshots are taken before the call ends and reach the plane after its end (they travel
    # apart over HTTP, and the worker builds them a slice at a time): the call stays ended, with its reason.
    decision = await env.worker.place_call("+15550199")
    stale = await env.worker.snapshot()
    await env.worker.end_call(decision.call_id, reason="caller_hangup")
    mark = await env.plane.store.last_event_id()
    assert env.worker.link is not None
    await env.worker.link.heartbeat(env.worker.info(), stale)
    call = await env.plane.get_call(decision.call_id)
    assert (call.state, call.end_reason) == ("ended", "caller_hangup")
    assert await env.plane.store.get_reservation(decision.call_id) is None
    assert [t for t, _ in await _event_types(env, mark)] == []
    env.clock.advance(11)
    await env.worker.heartbeat()
    assert (await env.plane.get_call(decision.call_id)).end_reason == "caller_hangup"  # not "vanished"


async def test_a_call_ended_as_worker_lost_comes_back_when_its_worker_reports_it_live(env: Env) -> None:
    # The plane ended it for want of news, not on the worker's word: the worker's snapshot is newer news.
    decision = await env.worker.place_call("+15550199")
    env.clock.advance(10)
    await env.plane.sweep()
    assert (await env.plane.get_call(decision.call_id)).end_reason == "worker_lost"
    await env.worker.heartbeat()
    call = await env.plane.get_call(decision.call_id)
    assert (call.state, call.end_reason) == ("active", "")
    assert await env.plane.store.get_reservation(decision.call_id) is not None


async def test_a_reported_handoff_is_published_with_the_call_updated(env: Env) -> None:
    decision = await env.worker.place_call("+15550199")
    after = await env.plane.store.last_event_id()
    call = env.worker.calls[decision.call_id]
    line = HandoffLine(at_s=3.5, from_profile="support", to_profile="sales", reason="buy", initiator="agent", ok=True)
    moved = call.model_copy(update={"handoffs": [line]})
    data = {"from_profile": "support", "to_profile": "sales", "reason": "buy", "initiator": "agent", "epoch": 2}
    await env.plane.report(
        [WorkerEvent(type="agent.handed_off", worker="worker-a", time=env.clock(), call=moved, data=data)]
    )
    events, _, _ = await env.plane.events_since(after)
    assert [event.type for event in events] == ["call.updated", "agent.handed_off"]
    assert events[1].data == {"call_id": decision.call_id, **data}
    assert events[0].data["handoffs"][0]["to_profile"] == "sales"
    assert (await env.plane.get_call(decision.call_id)).handoffs == [line]
