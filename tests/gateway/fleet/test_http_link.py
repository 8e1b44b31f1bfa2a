"""HttpControlLink + worker_api + HttpWorkerCommands end to end over two real loopback uvicorn servers."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI

from gateway.control.app import create_app
from gateway.control.plane import ControlPlane
from gateway.control.settings import ControlSettings
from gateway.fleet import (
    AdmissionRequest,
    CallNotFoundError,
    HttpControlLink,
    HttpWorkerCommands,
    LinkAuthError,
    LinkError,
    RetryPolicy,
    install_json_errors,
    worker_api,
)
from gateway.fleet.models import HeartbeatRequest
from tests.gateway.control.conftest import make_config
from tests.gateway.fleet.fake_worker import FakeWorker
from tests.gateway.fleet.servers import serve

TOKEN = "fleet-token-abcdef0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def worker_app(worker: FakeWorker, token: str) -> FastAPI:
    app = FastAPI()
    install_json_errors(app)
    app.include_router(worker_api(worker, token))
    return app


@dataclass
class Split:
    control_url: str
    worker_url: str
    plane: ControlPlane
    worker: FakeWorker
    link: HttpControlLink
    api: httpx.AsyncClient


@pytest.fixture
async def split() -> AsyncIterator[Split]:
    control = create_app(ControlSettings(api_token=TOKEN), config=make_config(), sweeper=False)
    worker = FakeWorker("worker-http", capacity=5)
    async with serve(control) as control_url, serve(worker_app(worker, TOKEN)) as worker_url:
        worker.url = worker_url
        link = HttpControlLink(control_url, TOKEN, policy=RetryPolicy(attempts=3, base_delay_s=0.01))
        await worker.connect(link)
        async with httpx.AsyncClient(base_url=control_url, headers=AUTH) as api:
            yield Split(control_url, worker_url, control.state.plane, worker, link, api)
        await link.aclose()


async def test_register_heartbeat_admit_report_over_http(split: Split) -> None:
    workers = (await split.api.get("/v1/workers")).json()["items"]
    assert [(w["id"], w["url"], w["status"]) for w in workers] == [("worker-http", split.worker_url, "up")]
    decision = await split.worker.place_call("+15550199")
    assert decision.accepted and decision.profile is not None and decision.profile.greeting == "Hello"
    await split.worker.update_call(decision.call_id, stats={"mos": 4.1})
    info = await split.worker.heartbeat()
    assert info.active_calls == 1 and info.load == pytest.approx(0.2)
    call = (await split.api.get(f"/v1/calls/{decision.call_id}")).json()
    assert call["state"] == "active" and call["stats"]["mos"] == 4.1 and call["worker"] == "worker-http"
    rejected = await split.worker.place_call("+15550300")
    assert not rejected.accepted and rejected.status == 404


async def test_ops_commands_travel_to_the_worker_and_back(split: Split) -> None:
    decision = await split.worker.place_call("+15550199")
    assert (await split.api.post(f"/v1/calls/{decision.call_id}/dtmf", json={"digits": "42#"})).status_code == 204
    assert split.worker.dtmf == [(decision.call_id, "42#")]
    assert (await split.api.post(f"/v1/calls/{decision.call_id}/hangup")).status_code == 204
    assert split.worker.hangups == [(decision.call_id, "api")]
    # The worker's call.ended report came back over HttpControlLink before the hang-up answer.
    assert (await split.api.get(f"/v1/calls/{decision.call_id}")).json()["state"] == "ended"

    created = await split.api.post("/v1/calls", json={"to": "+15550123", "route": "sales"})
    assert created.status_code == 201
    assert split.worker.originated[0][1].call_id == created.json()["id"]

    drained = await split.api.post("/v1/workers/worker-http/drain", json={"exit_when_empty": False})
    assert drained.status_code == 200 and split.worker.drains == [False]


async def test_worker_errors_map_to_api_errors(split: Split) -> None:
    decision = await split.worker.place_call("+15550199")
    split.worker.calls.pop(decision.call_id)  # the worker lost track of it
    response = await split.api.post(f"/v1/calls/{decision.call_id}/hangup")
    assert response.status_code == 404 and response.json()["error"]["code"] == "call_not_found"
    decision = await split.worker.place_call("+15550199")
    await split.worker.update_call(decision.call_id, state="ringing")
    response = await split.api.post(f"/v1/calls/{decision.call_id}/transfer", json={"target": "+1"})
    assert response.status_code == 409 and "ringing" in response.json()["error"]["message"]
    response = await split.api.post(f"/v1/calls/{decision.call_id}/warm_transfer", json={"target": "+1"})
    assert response.status_code == 409 and "ringing" in response.json()["error"]["message"]


async def test_a_warm_transfer_crosses_the_worker_api(split: Split) -> None:
    decision = await split.worker.place_call("+15550199")
    response = await split.api.post(f"/v1/calls/{decision.call_id}/warm_transfer", json={"target": "sip:h@x"})
    assert response.status_code == 202, response.text
    assert response.json()["human_leg"] == "c-human" and response.json()["target"] == "sip:h@x"
    assert [(call_id, r.target) for call_id, r in split.worker.warm_transfers] == [(decision.call_id, "sip:h@x")]
    joined = await split.api.post(f"/v1/calls/{decision.call_id}/warm_transfer/join")
    assert joined.status_code == 202 and joined.json()["state"] == "briefing", joined.text
    assert split.worker.warm_joins == [decision.call_id]
    other = await split.worker.place_call("+15550199")
    refused = await split.api.post(f"/v1/calls/{other.call_id}/warm_transfer/join")
    assert refused.status_code == 409 and "no warm transfer" in refused.json()["error"]["message"]


async def test_http_worker_commands_snapshot_and_not_found(split: Split) -> None:
    decision = await split.worker.place_call("+15550201")
    commands = HttpWorkerCommands(split.worker_url, TOKEN)
    try:
        snapshot = await commands.snapshot()
        assert [c.id for c in snapshot] == [decision.call_id] and snapshot[0].from_ == "+15550100"
        with pytest.raises(CallNotFoundError) as caught:
            await commands.hang_up("c-nope", "api")
        assert caught.value.call_id == "c-nope"
    finally:
        await commands.aclose()


async def test_token_mismatch_is_link_auth_error(split: Split) -> None:
    wrong = HttpControlLink(split.control_url, "not-the-token", policy=RetryPolicy(attempts=3, base_delay_s=0.01))
    try:
        with pytest.raises(LinkAuthError):
            await wrong.admit(AdmissionRequest(called="+15550199"))
    finally:
        await wrong.aclose()
    commands = HttpWorkerCommands(split.worker_url, "not-the-token")
    try:
        with pytest.raises(LinkAuthError):
            await commands.snapshot()
    finally:
        await commands.aclose()


async def test_unreachable_control_plane_fails_after_bounded_retries() -> None:
    attempts: list[httpx.Request] = []

    def refuse(request: httpx.Request) -> httpx.Response:
        attempts.append(request)
        raise httpx.ConnectError("connection refused", request=request)

    client = httpx.AsyncClient(transport=httpx.MockTransport(refuse))
    link = HttpControlLink(
        "http://127.0.0.1:9", TOKEN, policy=RetryPolicy(attempts=4, base_delay_s=0.001), client=client
    )
    await link.report([])  # nothing to report: no request at all
    assert attempts == []
    with pytest.raises(LinkError, match="ConnectError"):
        await link.admit(AdmissionRequest(called="+1"))
    assert len(attempts) == 4
    assert len({r.read() for r in attempts}) == 1  # every retry carries the same call id (idempotent)
    await client.aclose()


async def test_server_errors_are_retried_then_succeed_and_4xx_are_not() -> None:
    answers = [500, 503, 200]
    seen: list[str] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        status = answers.pop(0) if answers else 422
        if status == 200:
            return httpx.Response(200, json={"accepted": True, "call_id": "c-1", "worker": "w", "route": "r"})
        return httpx.Response(status, json={"error": {"code": "x", "message": "boom"}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(flaky)) as client:
        link = HttpControlLink(
            "http://control", TOKEN, policy=RetryPolicy(attempts=5, base_delay_s=0.001), client=client
        )
        decision = await link.admit(AdmissionRequest(called="+1"))
        assert decision.call_id == "c-1" and seen == ["/internal/v1/admit"] * 3
        with pytest.raises(LinkError, match="HTTP 422: boom"):
            await link.admit(AdmissionRequest(called="+1"))
        assert len(seen) == 4


def test_retry_delays_grow_and_are_capped() -> None:
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=0.5)
    assert [policy.delay(n) for n in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]


async def test_a_heartbeat_sends_the_json_of_a_heartbeat_request_with_every_call(split: Split) -> None:
    """The link dumps the calls one at a time (the loop let in between) and encodes with orjson: the plane gets
    exactly what HeartbeatRequest would have dumped, as application/json."""
    calls = []
    for number in range(3):
        decision = await split.worker.place_call(f"+1555020{number}")
        calls.append(split.worker.calls[decision.call_id])
    sent: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return httpx.Response(200, json=split.worker.info().model_dump(mode="json"))

    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
        link = HttpControlLink("http://plane.test", TOKEN, client=client)
        await link.heartbeat(split.worker.info(), calls)
    [request] = sent
    assert request.headers["content-type"] == "application/json"
    expected = HeartbeatRequest(info=split.worker.info(), calls=calls).model_dump(mode="json", by_alias=True)
    assert json.loads(request.content) == expected
    assert [call["from"] for call in expected["calls"]] == ["+15550100"] * 3  # aliases, as the plane reads them


async def test_a_link_to_several_control_planes_fails_over_and_stays_with_the_one_that_answers() -> None:
    """Replicas sharing state: the first URL refuses connections (a replica restarting); the link registers
    through the second at once, without the policy's back-off, and keeps using it."""
    from tests.support.procs import free_ports

    dead = f"http://127.0.0.1:{free_ports(1)[0]}"
    control = create_app(ControlSettings(api_token=TOKEN), config=make_config(), sweeper=False)
    worker = FakeWorker("worker-failover", capacity=5)
    worker.url = "http://127.0.0.1:9/worker-api"
    async with serve(control) as live:
        link = HttpControlLink(f"{dead}, {live}", TOKEN, policy=RetryPolicy(attempts=2, base_delay_s=5.0))
        try:
            registered = await asyncio.wait_for(link.register(worker.info()), timeout=3)  # no 5 s back-off
            assert registered.id == "worker-failover" and link.control_url == live
            await link.heartbeat(worker.info(), [])
            assert link.control_url == live
            assert [w.id for w in await control.state.plane.list_workers()] == ["worker-failover"]
        finally:
            await link.aclose()
    # Both gone: the error names the last URL tried.
    link = HttpControlLink(f"{dead},{dead}", TOKEN, policy=RetryPolicy(attempts=2, base_delay_s=0.01))
    try:
        with pytest.raises(LinkError, match="ConnectError"):
            await link.heartbeat(worker.info(), [])
    finally:
        await link.aclose()


async def test_answers_of_a_newer_control_plane_are_taken_and_their_new_fields_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The plane updated before its workers: its answers carry fields this worker does not know."""
    caplog.set_level(logging.WARNING, logger="gateway.fleet.http")
    worker = FakeWorker("worker-old", capacity=5)

    def newer_plane(request: httpx.Request) -> httpx.Response:
        if b'"route":"bad"' in request.content.replace(b" ", b""):
            return httpx.Response(200, json={"accepted": "perhaps"})
        if request.url.path.endswith("/admit"):
            profile = {"name": "support", "provider": "echo", "greeting": "Hello", "language": "de"}
            decision = {"accepted": True, "call_id": "c-1", "worker": "worker-old", "route": "support"}
            return httpx.Response(200, json=decision | {"profile": profile, "queue_position": 0})
        if request.url.path.endswith("/heartbeat"):
            return httpx.Response(200, json=worker.info().model_dump(mode="json") | {"zone": "eu-1"})
        return httpx.Response(404, json={"error": {"code": "not_found", "message": request.url.path}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(newer_plane)) as client:
        link = HttpControlLink("http://plane.test", TOKEN, client=client)
        for _ in range(3):
            decision = await link.admit(AdmissionRequest(called="+15550199"))
            assert decision.accepted and decision.profile is not None and decision.profile.greeting == "Hello"
            assert (await link.heartbeat(worker.info(), [])).id == "worker-old"
        with pytest.raises(LinkError, match="admit: malformed answer: accepted: Input should be a valid boolean"):
            await link.admit(AdmissionRequest(called="+15550199", route="bad"))  # a known field gone wrong
    skew = sorted(r.getMessage() for r in caplog.records if "does not know" in r.getMessage())
    assert skew == [
        "the control plane's admit answer has fields this worker does not know (the plane runs a newer version); "
        "they are ignored: profile.language, queue_position",
        "the control plane's heartbeat answer has fields this worker does not know (the plane runs a newer version); "
        "they are ignored: zone",
    ]


async def test_a_workers_command_api_takes_a_newer_planes_commands_and_logs_their_new_fields_once(
    split: Split, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.fleet.compat")
    async with httpx.AsyncClient(base_url=split.worker_url, headers=AUTH) as worker_api_client:
        for _ in range(2):
            body = {"exit_when_empty": True, "deadline_s": 30, "goodbye": "Bye for now"}
            response = await worker_api_client.post("/internal/v1/drain", json=body)
            assert response.status_code == 204, response.text
        assert split.worker.drains == [True, True] and split.worker.drain_deadlines == [30, 30]
        response = await worker_api_client.post("/internal/v1/drain", json={"exit_when_empty": "soon", "goodbye": "x"})
        assert response.status_code == 422
        assert response.json()["error"]["message"].startswith("exit_when_empty: Input should be a valid boolean")
    assert [r.getMessage() for r in caplog.records] == [
        "/internal/v1/drain: the sender runs a newer version; fields this one does not know are ignored: goodbye"
    ]


async def test_a_newer_workers_call_list_is_read_without_its_new_fields() -> None:
    calls = [{"id": "c-1", "state": "active", "archive": True, "stats": {"mos": 4.1, "dtx_frames": 2}}]

    def newer_worker(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=calls)

    async with httpx.AsyncClient(transport=httpx.MockTransport(newer_worker)) as client:
        commands = HttpWorkerCommands("http://worker.test", TOKEN, client=client)
        [call] = await commands.snapshot()
        assert (call.id, call.state, call.stats.mos) == ("c-1", "active", 4.1)
        calls[0]["state"] = "dancing"
        with pytest.raises(LinkError, match=r"snapshot: malformed answer: 0\.state: Input should be"):
            await commands.snapshot()
