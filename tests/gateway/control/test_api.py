"""Ops API over ASGITransport with a fake worker attached in-process: auth, errors, calls, commands."""

from __future__ import annotations

import hmac

import pytest

from tests.gateway.control.conftest import AUTH, TOKEN, Env


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"}, {"Authorization": "Bearer "}],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/calls"),
        ("GET", "/v1/workers"),
        ("POST", "/v1/workers/worker-a/drain"),
        ("GET", "/metrics"),
        ("POST", "/internal/v1/admit"),
        ("GET", "/v1/events"),
    ],
)
async def test_requests_without_the_right_token_get_401(env: Env, headers: dict, method: str, path: str) -> None:
    response = await env.client.request(method, path, headers=headers, json={})
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"
    assert response.headers["www-authenticate"] == "Bearer"
    assert env.worker.drains == []


async def test_the_token_is_compared_in_constant_time(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return real(a, b)

    monkeypatch.setattr("gateway.fleet.auth.hmac.compare_digest", spy)
    assert (await env.client.get("/v1/workers", headers={"Authorization": "Bearer nope"})).status_code == 401
    assert (await env.client.get("/v1/workers", headers=AUTH)).status_code == 200
    assert seen == [(b"nope", TOKEN.encode()), (TOKEN.encode(), TOKEN.encode())]


async def test_health_is_open_and_says_auth_is_required(env: Env) -> None:
    response = await env.client.get("/healthz")
    assert response.json() == {"status": "ok", "auth_required": True}


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/no/such/path", 404, "not_found"),
        ("GET", "/v1/calls/c-unknown", 404, "call_not_found"),
        ("GET", "/v1/workers/w-unknown", 404, "worker_not_found"),
        ("PUT", "/v1/calls", 405, "method_not_allowed"),
        ("GET", "/v1/calls?limit=0", 422, "validation_error"),
        ("GET", "/v1/calls?state=bogus", 422, "validation_error"),
        ("GET", "/v1/calls?cursor=%21%21", 422, "invalid_cursor"),
    ],
)
async def test_errors_are_json_with_code_and_message(env: Env, method: str, path: str, status: int, code: str) -> None:
    response = await env.client.request(method, path, headers=AUTH)
    assert response.status_code == status
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]


async def test_list_filters_and_paginates_newest_first(env: Env) -> None:
    other = await env.add_worker("worker-b")
    ids = []
    for index in range(5):
        env.clock.advance(1)
        worker = env.worker if index % 2 == 0 else other
        decision = await worker.place_call("+15550201" if index < 4 else "+4420123")
        assert decision.accepted
        ids.append(decision.call_id)
    await env.worker.end_call(ids[0])

    page = (await env.client.get("/v1/calls?limit=2", headers=AUTH)).json()
    assert [c["id"] for c in page["items"]] == [ids[4], ids[3]]
    assert page["total"] == 5
    second = (await env.client.get(f"/v1/calls?limit=2&cursor={page['next_cursor']}", headers=AUTH)).json()
    assert [c["id"] for c in second["items"]] == [ids[2], ids[1]]
    third = (await env.client.get(f"/v1/calls?limit=2&cursor={second['next_cursor']}", headers=AUTH)).json()
    assert [c["id"] for c in third["items"]] == [ids[0]]
    assert third["next_cursor"] is None

    by_worker = (await env.client.get("/v1/calls?worker=worker-b", headers=AUTH)).json()
    assert {c["id"] for c in by_worker["items"]} == {ids[1], ids[3]}
    by_route = (await env.client.get("/v1/calls?route=uk", headers=AUTH)).json()
    assert [c["id"] for c in by_route["items"]] == [ids[4]]
    ended = (await env.client.get("/v1/calls?state=ended", headers=AUTH)).json()
    assert [c["id"] for c in ended["items"]] == [ids[0]]
    live = (await env.client.get("/v1/calls?live=true", headers=AUTH)).json()
    assert ids[0] not in {c["id"] for c in live["items"]} and live["total"] == 4


async def test_call_detail_has_stats_and_transcript_the_list_leaves_out(env: Env) -> None:
    decision = await env.worker.place_call("+15550199")
    await env.worker.update_call(
        decision.call_id,
        stats={"jitter_ms": 4.5, "mos": 4.2, "loss_pct": 0.5},
        transcript=[{"role": "user", "text": "Where is my order?"}, {"role": "assistant", "text": "Let me look."}],
    )
    detail = (await env.client.get(f"/v1/calls/{decision.call_id}", headers=AUTH)).json()
    assert detail["stats"]["jitter_ms"] == 4.5 and detail["stats"]["mos"] == 4.2
    # Times in the call and truncation are null/false when the worker does not report them.
    assert detail["transcript"][1] == {
        "role": "assistant", "text": "Let me look.", "start_s": None, "end_s": None, "truncated": False
    }  # fmt: skip
    assert detail["from"] == "+15550100" and detail["route"] == "support" and detail["provider"] == "echo"
    listed = (await env.client.get("/v1/calls", headers=AUTH)).json()["items"][0]
    assert listed["transcript"] == [] and listed["stats"]["mos"] == 4.2


async def test_hangup_reaches_the_worker_and_ends_the_call(env: Env) -> None:
    decision = await env.worker.place_call("+15550199")
    response = await env.client.post(f"/v1/calls/{decision.call_id}/hangup", headers=AUTH, json={"reason": "abuse"})
    assert response.status_code == 204
    assert env.worker.hangups == [(decision.call_id, "abuse")]
    call = (await env.client.get(f"/v1/calls/{decision.call_id}", headers=AUTH)).json()
    assert call["state"] == "ended" and call["end_reason"] == "hangup:abuse"
    again = await env.client.post(f"/v1/calls/{decision.call_id}/hangup", headers=AUTH)
    assert again.status_code == 409 and again.json()["error"]["code"] == "command_rejected"


async def test_transfer_and_dtmf(env: Env) -> None:
    decision = await env.worker.place_call("+15550199")
    call_id = decision.call_id
    assert (
        await env.client.post(f"/v1/calls/{call_id}/transfer", headers=AUTH, json={"target": "+1"})
    ).status_code == 204
    assert env.worker.transfers == [(call_id, "+1")]
    assert (
        await env.client.post(f"/v1/calls/{call_id}/dtmf", headers=AUTH, json={"digits": "12#*ad"})
    ).status_code == 204
    assert env.worker.dtmf == [(call_id, "12#*AD")]
    for bad in ["", "12x", "E", "1 2", "9" * 65]:
        response = await env.client.post(f"/v1/calls/{call_id}/dtmf", headers=AUTH, json={"digits": bad})
        assert response.status_code == 422, bad
        assert response.json()["error"]["code"] == "validation_error"
    assert len(env.worker.dtmf) == 1


async def test_warm_transfer_reaches_the_worker_and_answers_its_line(env: Env) -> None:
    decision = await env.worker.place_call("+15550199")
    call_id = decision.call_id
    body = {"target": "sales", "summary": "Wants the annual plan.", "ring_timeout_s": 20}
    response = await env.client.post(f"/v1/calls/{call_id}/warm_transfer", headers=AUTH, json=body)
    assert response.status_code == 202, response.text
    line = response.json()
    assert (line["caller_leg"], line["human_leg"], line["state"]) == (call_id, "c-human", "dialling")
    ((called, request),) = env.worker.warm_transfers
    assert called == call_id and request.summary == "Wants the annual plan." and request.caller_hears == "hold"
    for bad in ({}, {"target": ""}, {"target": "x", "ring_timeout_s": 0}, {"target": "x", "caller_hears": "music"}):
        refused = await env.client.post(f"/v1/calls/{call_id}/warm_transfer", headers=AUTH, json=bad)
        assert refused.status_code == 422, bad
    unknown = await env.client.post("/v1/calls/c-nope/warm_transfer", headers=AUTH, json={"target": "x"})
    assert unknown.status_code == 404
    await env.worker.update_call(call_id, state="held")
    held = await env.client.post(f"/v1/calls/{call_id}/warm_transfer", headers=AUTH, json={"target": "x"})
    assert held.status_code == 409 and "held" in held.json()["error"]["message"]


async def test_warm_transfer_join_reaches_the_worker_and_409s_without_a_transfer(env: Env) -> None:
    decision = await env.worker.place_call("+15550199")
    call_id = decision.call_id
    none = await env.client.post(f"/v1/calls/{call_id}/warm_transfer/join", headers=AUTH)
    assert none.status_code == 409 and "no warm transfer" in none.json()["error"]["message"]
    body = {"target": "sales", "briefing": "conversation"}
    assert (await env.client.post(f"/v1/calls/{call_id}/warm_transfer", headers=AUTH, json=body)).status_code == 202
    assert env.worker.warm_transfers[0][1].briefing == "conversation"
    joined = await env.client.post(f"/v1/calls/{call_id}/warm_transfer/join", headers=AUTH)
    assert joined.status_code == 202, joined.text
    assert joined.json()["caller_leg"] == call_id and env.worker.warm_joins == [call_id]
    bad = await env.client.post(f"/v1/calls/{call_id}/warm_transfer", headers=AUTH, json={**body, "briefing": "x"})
    assert bad.status_code == 422


async def test_say_inject_update_reach_the_worker_and_bad_ones_are_answered(env: Env) -> None:
    decision = await env.worker.place_call("+15550199")
    call_id = decision.call_id
    for path, body in (
        ("say", {"text": "One moment.", "interrupt": True}),
        ("inject", {"text": "The order shipped.", "role": "system", "respond": True}),
        ("update", {"instructions": "Speak French."}),
    ):
        response = await env.client.post(f"/v1/calls/{call_id}/{path}", headers=AUTH, json=body)
        assert response.status_code == 204, (path, response.text)
    commands = [command for _, command in env.worker.agent_commands]
    assert commands[0].say is not None and commands[0].say.interrupt
    assert commands[1].inject is not None and commands[1].inject.role == "system" and commands[1].inject.respond
    assert commands[2].update is not None and commands[2].update.instructions == "Speak French."
    for path, bad in (
        ("say", {}),
        ("say", {"text": ""}),
        ("inject", {"text": "x", "role": "assistant"}),
        ("update", {}),
        ("update", {"tools": []}),
    ):
        response = await env.client.post(f"/v1/calls/{call_id}/{path}", headers=AUTH, json=bad)
        assert response.status_code == 422, (path, bad)
        assert response.json()["error"]["code"] == "validation_error"
    assert len(env.worker.agent_commands) == 3
    unknown = await env.client.post("/v1/calls/c-nope/say", headers=AUTH, json={"text": "hi"})
    assert unknown.status_code == 404
    await env.worker.update_call(call_id, state="resuming")
    busy = await env.client.post(f"/v1/calls/{call_id}/say", headers=AUTH, json={"text": "hi"})
    assert busy.status_code == 409 and "resuming" in busy.json()["error"]["message"]
    await env.worker.end_call(call_id)
    ended = await env.client.post(f"/v1/calls/{call_id}/inject", headers=AUTH, json={"text": "hi"})
    assert ended.status_code == 409 and "ended" in ended.json()["error"]["message"]


async def test_command_the_worker_rejects_is_409(env: Env) -> None:
    decision = await env.worker.place_call("+15550199")
    await env.worker.update_call(decision.call_id, state="resuming")
    response = await env.client.post(f"/v1/calls/{decision.call_id}/transfer", headers=AUTH, json={"target": "+1"})
    assert response.status_code == 409
    assert "resuming" in response.json()["error"]["message"]


async def test_originate_returns_201_with_location(env: Env) -> None:
    body = {"to": "sip:+15550123@trunk.example.net", "caller_id": "+15550201"}
    response = await env.client.post("/v1/calls", headers=AUTH, json=body)
    assert response.status_code == 201
    created = response.json()
    assert created["worker"] == "worker-a" and created["route"] == "sales"
    assert response.headers["location"] == f"/v1/calls/{created['id']}"
    request, admission = env.worker.originated[0]
    assert request.to == body["to"] and admission.call_id == created["id"]
    assert admission.profile is not None and admission.profile.model == "gpt-realtime"
    call = (await env.client.get(response.headers["location"], headers=AUTH)).json()
    assert call["direction"] == "outbound" and call["state"] == "ringing"

    unknown = await env.client.post("/v1/calls", headers=AUTH, json={"to": "+1", "caller_id": "+999"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "no_route"
    named = await env.client.post("/v1/calls", headers=AUTH, json={"to": "+1", "route": "nope"})
    assert named.status_code == 404


async def test_drain_tells_the_worker_and_readiness_follows(env: Env) -> None:
    assert (await env.client.get("/readyz")).status_code == 200
    response = await env.client.post(
        "/v1/workers/worker-a/drain", headers=AUTH, json={"exit_when_empty": True, "deadline_s": 45}
    )
    assert response.status_code == 200
    assert response.json()["status"] == "draining" and response.json()["draining"] is True
    assert env.worker.drains == [True] and env.worker.drain_deadlines == [45.0]
    ready = await env.client.get("/readyz")
    assert ready.status_code == 503 and ready.json() == {"ready": False, "workers_up": 0, "shutting_down": False}
    rejected = await env.worker.place_call("+15550199")
    assert not rejected.accepted and rejected.status == 503 and rejected.code == "no_worker"
    workers = (await env.client.get("/v1/workers", headers=AUTH)).json()["items"]
    assert [(w["id"], w["status"]) for w in workers] == [("worker-a", "draining")]


async def test_metrics_need_the_token_and_expose_the_shared_registry(env: Env) -> None:
    await env.worker.place_call("+15550199")
    assert (await env.client.get("/metrics")).status_code == 401
    response = await env.client.get("/metrics", headers=AUTH)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    assert 'gateway_workers{status="up"} 1.0' in text
    assert 'gateway_admissions_total{outcome="accepted"}' in text
    assert "gateway_rtp_packets_total" in text or "# HELP gateway_rtp_packets_total" in text


async def test_session_sets_a_scoped_httponly_cookie(env: Env) -> None:
    response = await env.client.post("/v1/session", headers=AUTH)
    assert response.status_code == 200
    assert response.json()["auth_required"] is True
    cookie = response.headers["set-cookie"]
    for part in ("gateway_sse=", "HttpOnly", "Path=/v1/events", "SameSite=strict", "Max-Age=3600"):
        assert part.lower() in cookie.lower()
    # The cookie opens only the event stream, never the commands.
    value = cookie.split(";")[0].split("=", 1)[1]
    calls = await env.client.get("/v1/calls", headers={"Cookie": f"gateway_sse={value}"})
    assert calls.status_code == 401


async def test_openapi_documents_errors_and_security(env: Env) -> None:
    schema = (await env.client.get("/openapi.json")).json()
    assert "HTTPBearer" in schema["components"]["securitySchemes"]
    hangup = schema["paths"]["/v1/calls/{call_id}/hangup"]["post"]["responses"]
    assert {"204", "401", "404", "409", "422", "502"} <= set(hangup)
    assert hangup["404"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
    assert schema["components"]["schemas"]["CallSnapshot"]["examples"]


async def test_profiles_lists_the_configured_profiles_by_name(env: Env) -> None:
    assert (await env.client.get("/v1/profiles")).status_code == 401
    response = await env.client.get("/v1/profiles", headers=AUTH)
    assert response.status_code == 200
    assert response.json() == {
        "items": [{"name": "sales", "provider": "openai"}, {"name": "support", "provider": "echo"}]
    }
    schema = (await env.client.get("/openapi.json")).json()
    assert "get" in schema["paths"]["/v1/profiles"]


async def test_handoff_goes_with_the_named_profile_and_bad_ones_are_answered(env: Env) -> None:
    decision = await env.worker.place_call("+15550199")
    call_id = decision.call_id
    response = await env.client.post(
        f"/v1/calls/{call_id}/handoff", headers=AUTH, json={"profile": "sales", "reason": "wants to buy"}
    )
    assert response.status_code == 204, response.text
    (_, command) = env.worker.agent_commands[-1]
    assert command.handoff is not None and command.handoff.reason == "wants to buy"
    assert command.target is not None and command.target.name == "sales" and command.target.voice == "marin"
    unknown = await env.client.post(f"/v1/calls/{call_id}/handoff", headers=AUTH, json={"profile": "nobody"})
    assert unknown.status_code == 409 and unknown.json()["error"]["code"] == "command_rejected"
    assert "no profile 'nobody'" in unknown.json()["error"]["message"] and "sales" in unknown.json()["error"]["message"]
    for bad in ({}, {"profile": ""}, {"profile": "sales", "extra": 1}, {"profile": "sales", "reason": "x" * 501}):
        response = await env.client.post(f"/v1/calls/{call_id}/handoff", headers=AUTH, json=bad)
        assert response.status_code == 422, bad
    tools = {"tools": [{"name": "hang_up"}, {"name": "lookup", "webhook": {"url": "https://hooks.test/lookup"}}]}
    response = await env.client.post(f"/v1/calls/{call_id}/update", headers=AUTH, json=tools)
    assert response.status_code == 204, response.text
    (_, command) = env.worker.agent_commands[-1]
    assert command.update is not None and [t.name for t in command.update.tools or []] == ["hang_up", "lookup"]
    duplicate = {"tools": [{"name": "hang_up"}, {"name": "hang_up"}]}
    assert (await env.client.post(f"/v1/calls/{call_id}/update", headers=AUTH, json=duplicate)).status_code == 422
    assert len(env.worker.agent_commands) == 2
    missing = await env.client.post("/v1/calls/c-nope/handoff", headers=AUTH, json={"profile": "sales"})
    assert missing.status_code == 404
    await env.worker.end_call(call_id)
    ended = await env.client.post(f"/v1/calls/{call_id}/handoff", headers=AUTH, json={"profile": "sales"})
    assert ended.status_code == 409 and "ended" in ended.json()["error"]["message"]
