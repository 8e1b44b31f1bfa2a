"""GET /v1/events over a real loopback server: live events, Last-Event-ID replay, gap, keepalive, cookie."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from gateway.control.app import create_app
from gateway.control.plane import ControlPlane
from gateway.control.settings import ControlSettings
from gateway.control.store import MemoryStore
from gateway.fleet import InProcessControlLink
from tests.gateway.control.conftest import AUTH, TOKEN, make_config
from tests.gateway.control.sse_reader import SseReader
from tests.gateway.fleet.fake_worker import FakeWorker
from tests.gateway.fleet.servers import serve


@pytest.fixture
async def live() -> AsyncIterator[tuple[str, ControlPlane, FakeWorker]]:
    config = make_config(fleet={"event_ring_size": 10, "sse_keepalive_s": 0.2})
    app = create_app(ControlSettings(api_token=TOKEN), config=config, store=MemoryStore(ring_size=10), sweeper=False)
    plane: ControlPlane = app.state.plane
    worker = FakeWorker("worker-a")
    await worker.connect(InProcessControlLink(plane, worker))
    async with serve(app) as url:
        yield url, plane, worker


async def test_live_events_carry_ids_types_and_snapshots(live: tuple[str, ControlPlane, FakeWorker]) -> None:
    url, _plane, worker = live
    async with httpx.AsyncClient(base_url=url) as client, client.stream("GET", "/v1/events", headers=AUTH) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        reader = SseReader(resp)
        assert (await reader.next()).fields == {"retry": "3000"}
        decision = await worker.place_call("+15550199")
        started = await reader.next_event()
        assert started.event == "call.started"
        assert started.json["data"]["id"] == decision.call_id and started.json["data"]["state"] == "admitted"
        updated = await reader.next_event()
        assert updated.event == "call.updated" and updated.json["data"]["state"] == "active"
        assert int(updated.id) == int(started.id) + 1 == updated.json["id"]
        await worker.update_call(decision.call_id, stats={"jitter_ms": 12.5})
        stats = await reader.next_event()
        assert stats.json["data"]["stats"]["jitter_ms"] == 12.5
        await worker.end_call(decision.call_id)
        ended = await reader.next_event()
        assert ended.event == "call.ended" and ended.json["data"]["end_reason"] == "caller_hangup"


async def test_keepalive_comment_when_idle(live: tuple[str, ControlPlane, FakeWorker]) -> None:
    url, _, _ = live
    async with httpx.AsyncClient(base_url=url) as client, client.stream("GET", "/v1/events", headers=AUTH) as resp:
        reader = SseReader(resp)
        await reader.next()  # retry
        assert (await reader.next(deadline_s=3)).comment == "keepalive"


async def test_last_event_id_replays_what_was_missed(live: tuple[str, ControlPlane, FakeWorker]) -> None:
    url, plane, worker = live
    mark = await plane.store.last_event_id()
    first = await worker.place_call("+15550199")
    await worker.end_call(first.call_id)
    headers = {**AUTH, "Last-Event-ID": str(mark)}
    async with httpx.AsyncClient(base_url=url) as client, client.stream("GET", "/v1/events", headers=headers) as resp:
        reader = SseReader(resp)
        replayed = [await reader.next_event() for _ in range(3)]
        assert [m.event for m in replayed] == ["call.started", "call.updated", "call.ended"]
        assert [int(m.id) for m in replayed] == [mark + 1, mark + 2, mark + 3]
        await worker.place_call("+15550201")
        live_event = await reader.next_event()
        assert int(live_event.id) == mark + 4


async def test_query_parameter_is_the_first_connection_cursor(live: tuple[str, ControlPlane, FakeWorker]) -> None:
    url, _plane, worker = live
    await worker.place_call("+15550199")
    async with httpx.AsyncClient(base_url=url) as client:
        last = (await client.get("/v1/calls", headers=AUTH)).json()["last_event_id"]
        await worker.place_call("+15550201")
        async with client.stream("GET", f"/v1/events?last_event_id={last}", headers=AUTH) as resp:
            reader = SseReader(resp)
            message = await reader.next_event()
            assert int(message.id) == last + 1 and message.json["data"]["to"] == "+15550201"


async def test_gap_when_the_requested_id_left_the_ring(live: tuple[str, ControlPlane, FakeWorker]) -> None:
    url, plane, worker = live
    for _ in range(8):  # 2 events each; the ring holds 10
        decision = await worker.place_call("+15550201")
        assert decision.accepted
        await worker.end_call(decision.call_id)
    newest = await plane.store.last_event_id()
    oldest = newest - 9
    headers = {**AUTH, "Last-Event-ID": "1"}
    async with httpx.AsyncClient(base_url=url) as client, client.stream("GET", "/v1/events", headers=headers) as resp:
        reader = SseReader(resp)
        gap = await reader.next_event()
        assert gap.event == "gap" and gap.id is None
        assert gap.json == {"requested": 1, "oldest": oldest}
        replay = [await reader.next_event() for _ in range(10)]
        assert [int(m.id) for m in replay] == list(range(oldest, newest + 1))


async def test_an_id_from_a_previous_life_is_a_gap_too(live: tuple[str, ControlPlane, FakeWorker]) -> None:
    url, plane, _worker = live
    newest = await plane.store.last_event_id()
    headers = {**AUTH, "Last-Event-ID": str(newest + 500)}
    async with httpx.AsyncClient(base_url=url) as client, client.stream("GET", "/v1/events", headers=headers) as resp:
        reader = SseReader(resp)
        gap = await reader.next_event()
        assert gap.event == "gap" and gap.json["requested"] == newest + 500
        assert int((await reader.next_event()).id) == gap.json["oldest"]


async def test_the_session_cookie_opens_the_stream_for_a_browser(live: tuple[str, ControlPlane, FakeWorker]) -> None:
    url, _, worker = live
    async with httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/v1/events")).status_code == 401
        assert (await client.post("/v1/session", headers=AUTH)).status_code == 200
        assert "gateway_sse" in client.cookies
        async with client.stream("GET", "/v1/events") as resp:
            assert resp.status_code == 200
            reader = SseReader(resp)
            await worker.place_call("+15550199")
            assert (await reader.next_event()).event == "call.started"
        forged = {"Cookie": "gateway_sse=99999999999.deadbeef"}
        client.cookies.clear()
        assert (await client.get("/v1/events", headers=forged)).status_code == 401


async def test_bad_last_event_id_is_422(live: tuple[str, ControlPlane, FakeWorker]) -> None:
    url, _, _ = live
    async with httpx.AsyncClient(base_url=url) as client:
        response = await client.get("/v1/events", headers={**AUTH, "Last-Event-ID": "abc"})
        assert response.status_code == 422 and response.json()["error"]["code"] == "validation_error"
