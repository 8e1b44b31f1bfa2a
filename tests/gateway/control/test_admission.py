"""Admission: route resolution, global/route/worker limits (503 + Retry-After), worker choice, idempotence."""

from __future__ import annotations

from gateway.fleet import AdmissionRequest
from tests.gateway.control.conftest import AUTH, Env


async def test_routes_resolve_exact_prefix_and_regex_in_file_order(env: Env) -> None:
    cases = {"+15550199": "support", "+15550201": "sales", "+15550209": "sales", "+442071234": "uk", "web": "browser"}
    for called, route in cases.items():
        decision = await env.plane.admit(AdmissionRequest(called=called, worker="worker-a"))
        assert decision.accepted and decision.route == route, called
        assert decision.profile is not None
    support = await env.plane.admit(AdmissionRequest(called="+15550199"))
    assert support.profile is not None and support.profile.greeting == "Hello"


async def test_unknown_number_is_404(env: Env) -> None:
    decision = await env.plane.admit(AdmissionRequest(called="+15550300"))
    assert not decision.accepted
    assert (decision.status, decision.code) == (404, "no_route")
    assert "+15550300" in decision.reason and decision.retry_after_s is None


async def test_public_webrtc_only_on_public_routes(env: Env) -> None:
    denied = await env.plane.admit(AdmissionRequest(kind="webrtc", route="sales", public=True))
    assert (denied.accepted, denied.status, denied.code) == (False, 403, "forbidden")
    allowed = await env.plane.admit(AdmissionRequest(kind="webrtc", route="browser", public=True))
    assert allowed.accepted and allowed.worker == "worker-a"


async def test_route_limit_gives_503_with_retry_after_and_frees_on_end(env: Env) -> None:
    first = await env.worker.place_call("+15550199")
    second = await env.worker.place_call("+15550199")
    third = await env.worker.place_call("+15550199")
    assert first.accepted and second.accepted
    assert (third.accepted, third.status, third.code, third.retry_after_s) == (False, 503, "over_capacity", 7)
    assert "support" in third.reason
    assert (await env.worker.place_call("+15550201")).accepted  # other routes still take calls
    await env.worker.end_call(first.call_id)
    assert (await env.worker.place_call("+15550199")).accepted


async def test_global_limit_over_the_api_is_503_with_retry_after_header(env: Env) -> None:
    for _ in range(6):
        assert (await env.worker.place_call("+15550201")).accepted
    response = await env.client.post("/v1/calls", headers=AUTH, json={"to": "+1", "route": "sales"})
    assert response.status_code == 503
    assert response.headers["retry-after"] == "7"
    assert response.json()["error"]["code"] == "over_capacity"
    assert env.worker.originated == []


async def test_least_loaded_worker_is_chosen_and_capacity_respected(env: Env) -> None:
    small = await env.add_worker("worker-b", capacity=1)
    placed = [await env.plane.admit(AdmissionRequest(called="+15550201")) for _ in range(4)]
    # load ratios: a 0/10 = b 0/1 -> a (id order); then a 1/10 > b 0/1 -> b; then b is full -> a, a.
    assert [d.worker for d in placed] == ["worker-a", "worker-b", "worker-a", "worker-a"]
    # worker-b (capacity 1) is full: a call arriving on it is refused so the SIP balancer tries another.
    on_b = await small.place_call("+15550201")
    assert not on_b.accepted and on_b.status == 503


async def test_worker_choice_prefers_the_lower_load_ratio(env: Env) -> None:
    big = await env.add_worker("worker-b", capacity=100)
    for _ in range(2):
        await env.worker.place_call("+15550201")  # worker-a: 2/10
    decision = await env.plane.admit(AdmissionRequest(called="+15550201"))
    assert decision.worker == big.worker_id


async def test_a_worker_fills_by_what_its_calls_cost(env: Env) -> None:
    # worker-a carries 10 G.711 calls; an Opus call takes 8 of them.
    opus = await env.worker.place_call("+15550201", codec="opus", cost=8.0)
    assert opus.accepted
    refused = await env.worker.place_call("+15550201", codec="opus", cost=8.0)
    assert (refused.accepted, refused.status, refused.code) == (False, 503, "over_capacity")
    assert [(await env.worker.place_call("+15550201")).accepted for _ in range(3)] == [True, True, False]
    stamped = await env.worker.heartbeat()
    assert (stamped.active_calls, stamped.used, stamped.load) == (3, 10.0, 1.0)
    await env.worker.end_call(opus.call_id)
    assert (await env.worker.place_call("+15550201", codec="opus", cost=8.0)).accepted


async def test_worker_choice_weighs_calls_by_cost(env: Env) -> None:
    other = await env.add_worker("worker-b", capacity=10)
    assert (await env.worker.place_call("+15550201", codec="opus", cost=8.0)).accepted  # worker-a: 8/10
    for _ in range(3):
        assert (await other.place_call("+15550201")).accepted  # worker-b: 3/10, more calls but less load
    decision = await env.plane.admit(AdmissionRequest(called="+15550201"))
    assert decision.worker == "worker-b"


async def test_a_call_whose_codec_turns_out_dearer_takes_its_cost(env: Env) -> None:
    # An outbound call is admitted before the callee picks the codec: at 1, until the worker reports Opus.
    call = await env.worker.place_call("+15550201")
    held = await env.plane.store.get_reservation(call.call_id)
    assert held is not None and held.cost == 1.0
    await env.worker.update_call(call.call_id, codec="opus", cost=8.0)
    held = await env.plane.store.get_reservation(call.call_id)
    assert held is not None and held.cost == 8.0
    refused = await env.worker.place_call("+15550201", codec="opus", cost=8.0)  # 8 + 8 > 10
    assert refused.code == "over_capacity"
    assert (await env.worker.place_call("+15550201", codec="PCMA")).accepted  # 8 + 1


async def test_same_call_id_is_idempotent(env: Env) -> None:
    request = AdmissionRequest(called="+15550199", call_id="c-fixed")
    first = await env.plane.admit(request)
    again = await env.plane.admit(request)
    assert first.accepted and again == first
    assert len(await env.plane.store.reservations()) == 1


async def test_no_worker_up_is_503(env: Env) -> None:
    await env.plane.drain("worker-a", exit_when_empty=False)
    decision = await env.plane.admit(AdmissionRequest(called="+15550199"))
    assert (decision.status, decision.code, decision.retry_after_s) == (503, "no_worker", 7)


async def test_a_cost_that_cannot_be_is_refused_with_its_reason_and_takes_nothing(env: Env) -> None:
    for cost in (0, 0.5, 1001, "lots"):
        response = await env.client.post(
            "/internal/v1/admit", headers=AUTH, json={"called": "+15550201", "worker": "worker-a", "cost": cost}
        )
        assert response.status_code == 422, (cost, response.text)
        error = response.json()["error"]
        assert error["code"] == "validation_error" and "cost" in error["message"], error
    assert await env.plane.store.reservations() == []
    heartbeat = {"info": {"id": "worker-a", "capacity": 10, "used": -1.0}, "calls": []}
    response = await env.client.post("/internal/v1/workers/worker-a/heartbeat", headers=AUTH, json=heartbeat)
    assert response.status_code == 422 and "used" in response.json()["error"]["message"]
