"""The ops API of a real ``gateway run`` with real SIP phones on the line.

- Inbound: baresip callers are listed by ``GET /v1/calls`` (filters, pagination) with statistics that move,
  ``GET /v1/calls/{id}`` has the transcript, DTMF sent with the API reaches the phone as RFC 4733 events,
  the API's hang-up reaches the phone as a BYE, the event stream tells the story (and replays it after a
  reconnect with ``Last-Event-ID``), ``/metrics`` counts it and ``/readyz`` is ready.
- Outbound: ``POST /v1/calls`` rings an auto-answering baresip through the worker's UAC, the echo agent
  talks back what the phone says, the API hangs up; a second call is blind-transferred (REFER) to another
  baresip, which the first phone then calls by itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.e2e.ops_support import EventStream, metric_value, poll
from tests.support.audio import align_and_correlate, read_wav
from tests.support.baresip import BaresipPhone
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(90)]

WORKER = "ops-w1"
CONFIG = """
[fleet]
sse_keepalive_s = 2

[[routes]]
name = "ops"
did = "agent"
profile = "echo"

[[routes]]
name = "fallback"
did = "*"
profile = "echo"

[profiles.echo]
provider = "echo"
"""


@pytest.fixture(autouse=True)
def _baresip() -> None:
    require_binary("baresip", package="baresip baresip-core")


async def _gateway(procs: ProcessGroup, tmp_path: Path, config: str | None = None) -> GatewayProcess:
    env = {"GATEWAY_WORKER_ID": WORKER}
    if config is not None:
        path = tmp_path / "gateway.toml"
        path.write_text(config)
        env["GATEWAY_CONFIG"] = str(path)
    return await start_gateway(procs, env=env)


async def _live_call(client: httpx.AsyncClient, **filters: str) -> dict[str, Any] | None:
    page = (await client.get("/v1/calls", params={"live": "true", **filters})).json()
    active = [call for call in page["items"] if call["state"] == "active"]
    return active[0] if len(active) == 1 else None


async def test_ops_api_lists_commands_and_streams_a_real_sip_call(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    gateway = await _gateway(peer_procs, tmp_path, CONFIG)
    held = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="held", tail_silence=30, codecs=("pcmu",))
    brief = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, name="brief", user="brief", codecs=("pcmu",))
    async with (
        gateway.client() as api,
        EventStream(gateway.http, gateway.token, last_event_id=0, name="sse") as stream,
        held,
        brief,
    ):
        assert (await api.get("/readyz")).json() == {"ready": True, "workers_up": 1, "shutting_down": False}
        await held.dial(gateway.sip_uri)  # sip:agent@ -> route "ops"
        await brief.dial(f"sip:+15550100@127.0.0.1:{gateway.sip_port}")  # -> route "fallback"
        await held.wait_established(within=10)
        await brief.wait_established(within=10)

        call = await poll(lambda: _live_call(api, route="ops"), within=10, what="the held call listed on route ops")
        call_id = call["id"]
        assert (call["route"], call["worker"], call["kind"], call["direction"]) == ("ops", WORKER, "sip", "inbound")
        assert call["to"] == "agent" and call["codec"].lower() == "pcmu" and call["transcript"] == []

        # The brief caller's WAV ends: it hangs up and its call is listed as ended on its own route.
        await brief.wait_closed(within=15)
        ended = await poll(
            lambda: _only(api, {"state": "ended"}), within=10, what="the brief call listed under state=ended"
        )
        assert ended["route"] == "fallback" and ended["end_reason"] == "caller_hangup" and ended["to"] == "+15550100"
        assert (await api.get("/v1/calls", params={"route": "nope"})).json()["items"] == []
        assert (await api.get("/v1/calls", params={"worker": "nope"})).json()["total"] == 0
        assert (await api.get("/v1/calls", params={"worker": WORKER})).json()["total"] == 2
        assert [c["id"] for c in (await api.get("/v1/calls", params={"state": "active"})).json()["items"]] == [call_id]

        # Keyset pagination, newest first: two pages of one call each, then no cursor.
        first = (await api.get("/v1/calls", params={"limit": 1})).json()
        assert first["total"] == 2 and len(first["items"]) == 1 and first["next_cursor"]
        second = (await api.get("/v1/calls", params={"limit": 1, "cursor": first["next_cursor"]})).json()
        assert second["next_cursor"] is None and len(second["items"]) == 1
        assert {first["items"][0]["id"], second["items"][0]["id"]} == {call_id, ended["id"]}
        assert first["items"][0]["started"] >= second["items"][0]["started"]
        bad = await api.get("/v1/calls", params={"cursor": "not-a-cursor"})
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "invalid_cursor"

        # Live statistics move between two reads (the worker heartbeats its media figures).
        before = (await api.get(f"/v1/calls/{call_id}")).json()["stats"]["rtp_packets_in"]
        moved = await poll(
            lambda: _grown(api, call_id, before), within=5, what=f"rtp_packets_in of {call_id} above {before}"
        )
        assert moved["stats"]["rtp_packets_out"] > 0 and moved["stats"]["mos"] is not None

        # A key the caller presses lands in the transcript of GET /v1/calls/{id}.
        await held.send_dtmf("5")
        detail = await poll(lambda: _pressed(api, call_id, "5"), within=10, what="'pressed 5' in the transcript")
        assert detail["state"] == "active"

        # DTMF from the API reaches the phone as RFC 4733 events.
        response = await api.post(f"/v1/calls/{call_id}/dtmf", json={"digits": "47#"})
        assert response.status_code == 204, response.text
        assert await held.wait_dtmf("47#", within=10) == "47#"
        bad_digits = await api.post(f"/v1/calls/{call_id}/dtmf", json={"digits": "9x"})
        assert bad_digits.status_code == 422 and bad_digits.json()["error"]["code"] == "validation_error"

        metrics = (await api.get("/metrics")).text
        assert metric_value(metrics, "gateway_active_calls", {"worker": WORKER}) == 1.0
        assert metric_value(metrics, "gateway_calls_total", {"worker": WORKER, "end_reason": "caller_hangup"}) == 1.0

        # The API's hang-up: BYE to the phone, and the call keeps its end reason.
        response = await api.post(f"/v1/calls/{call_id}/hangup", json={"reason": "operator"})
        assert response.status_code == 204, response.text
        await held.wait_closed(within=10)
        ended_event = await stream.wait_for(
            lambda e: e.type == "call.ended" and e.call_id == call_id, within=10, what="call.ended of the held call"
        )
        assert ended_event.subject["end_reason"] == "operator" and ended_event.subject["transcript"] == []
        final = (await api.get(f"/v1/calls/{call_id}")).json()
        assert final["state"] == "ended" and final["end_reason"] == "operator" and final["ended"] is not None
        again = await api.post(f"/v1/calls/{call_id}/hangup")
        assert again.status_code == 409 and again.json()["error"]["code"] == "command_rejected"
        missing = await api.post("/v1/calls/c-nope/hangup")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "call_not_found"

        metrics = (await api.get("/metrics")).text
        assert metric_value(metrics, "gateway_active_calls", {"worker": WORKER}) == 0.0
        assert metric_value(metrics, "gateway_calls_total", {"worker": WORKER, "end_reason": "operator"}) == 1.0
        async with httpx.AsyncClient(base_url=gateway.http) as anonymous:
            assert (await anonymous.get("/metrics")).status_code == 401

        # The stream told the held call's story in order, with consecutive fleet-wide ids.
        story = stream.of_call(call_id)
        kinds = [e.type for e in story]
        assert kinds[0] == "call.started" and kinds[-1] == "call.ended" and "call.updated" in kinds
        assert kinds.count("call.started") == 1 and kinds.count("call.ended") == 1
        ids = [e.id for e in stream.events if e.id is not None]
        assert len(ids) == len(stream.events) and ids == list(range(ids[0], ids[0] + len(ids)))
        assert stream.events[0].type == "worker.registered" and stream.events[0].subject["id"] == WORKER
        assert {e.subject.get("state") for e in story if e.type == "call.updated"} >= {"active"}

    # A client that reconnects with Last-Event-ID gets exactly what came after that id.
    resume_after = story[0].id
    assert resume_after is not None
    seen_after = [(e.id, e.type, e.call_id) for e in stream.events if e.id is not None and e.id > resume_after]
    async with EventStream(gateway.http, gateway.token, header_id=resume_after, name="replay") as replay:
        last_id = seen_after[-1][0]
        await replay.wait_for(lambda e: e.id == last_id, within=10, what=f"replay up to id {last_id}")
        replayed = [(e.id, e.type, e.call_id) for e in replay.events if e.id is not None and e.id <= last_id]
        assert replayed == seen_after
        assert all(e.type != "gap" for e in replay.events)


async def _only(client: httpx.AsyncClient, filters: dict[str, str]) -> dict[str, Any] | None:
    items = (await client.get("/v1/calls", params=filters)).json()["items"]
    return items[0] if len(items) == 1 else None


async def _grown(client: httpx.AsyncClient, call_id: str, before: int) -> dict[str, Any] | None:
    call: dict[str, Any] = (await client.get(f"/v1/calls/{call_id}")).json()
    return call if call["stats"]["rtp_packets_in"] > before else None


async def _pressed(client: httpx.AsyncClient, call_id: str, digit: str) -> dict[str, Any] | None:
    call: dict[str, Any] = (await client.get(f"/v1/calls/{call_id}")).json()
    pressed = [line["text"] for line in call["transcript"] if line["role"] == "user" and "pressed" in line["text"]]
    return call if any(text.split("pressed ")[1].startswith(digit) for text in pressed) else None


async def _call_state(client: httpx.AsyncClient, call_id: str, state: str) -> dict[str, Any] | None:
    call: dict[str, Any] = (await client.get(f"/v1/calls/{call_id}")).json()
    return call if call["state"] == state else None


async def test_gateway_places_a_call_hangs_up_and_blind_transfers(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    gateway = await _gateway(peer_procs, tmp_path)
    alice = BaresipPhone(
        peer_procs, tmp_path, source_wav=speech_8k, name="alice", user="alice", auto_answer=True, tail_silence=25
    )
    bob = BaresipPhone(
        peer_procs, tmp_path, source_wav=speech_8k, name="bob", user="bob", auto_answer=True, tail_silence=25
    )
    speech = read_wav(speech_8k)
    spoken_packets = int(len(speech.samples) / speech.rate / 0.02)
    async with gateway.client() as api, alice, bob:
        # 1. The gateway calls alice; the echo agent says back what she says; the API hangs up.
        response = await api.post("/v1/calls", json={"to": alice.sip_uri, "caller_id": "+15550199"})
        assert response.status_code == 201, response.text
        created = response.json()
        call_id = created["id"]
        assert response.headers["location"] == f"/v1/calls/{call_id}" and created["worker"] == WORKER
        await alice.wait_established(within=10)
        answered = await poll(lambda: _call_state(api, call_id, "active"), within=10, what="the outbound call active")
        assert answered["direction"] == "outbound" and answered["to"] == "alice" and answered["from"] == "+15550199"
        # Wait until the gateway has received all of alice's speech and one second more (the echo's delay).
        await poll(
            lambda: _grown(api, call_id, spoken_packets + 50),
            within=15,
            what="alice's speech received by the gateway",
            every=0.25,
        )
        response = await api.post(f"/v1/calls/{call_id}/hangup")
        assert response.status_code == 204, response.text
        closed = await alice.wait_closed(within=10)
        assert closed.peer_uri is not None and "+15550199" in closed.peer_uri  # the gateway's call, by its BYE
        first = await poll(lambda: _call_state(api, call_id, "ended"), within=10, what="the outbound call ended")
        assert first["end_reason"] == "api"
        heard = read_wav(alice.recordings()[0].decoded)
        # A jitter buffer (ours or baresip's) may shift the delay by a frame or two mid-call under CPU
        # pressure without losing audio: allow that much slip between windows.
        correlation, lag = align_and_correlate(speech.samples, heard.samples, speech.rate, max_slip_seconds=0.15)
        assert correlation >= 0.9, f"alice heard her echo with correlation {correlation:.3f} (lag {lag})"

        # 2. A second call to alice is blind-transferred to bob: REFER, alice calls bob, NOTIFY 200, BYE.
        response = await api.post("/v1/calls", json={"to": alice.sip_uri})
        assert response.status_code == 201, response.text
        second_id = response.json()["id"]
        await alice.wait_established(within=10, nth=2)
        await poll(lambda: _call_state(api, second_id, "active"), within=10, what="the second call active")
        response = await api.post(f"/v1/calls/{second_id}/transfer", json={"target": bob.sip_uri})
        assert response.status_code == 204, response.text
        await bob.wait_established(within=10)
        transferred = await poll(
            lambda: _call_state(api, second_id, "ended"), within=15, what="the transferred call ended"
        )
        assert transferred["end_reason"] == "transferred"
        await alice.wait_closed(within=5, nth=2)  # the gateway's leg; alice and bob talk on
        refer = [e for e in alice.events if e.type == "TRANSFER"]  # baresip accepted the REFER and dials the target
        assert len(refer) == 1 and refer[0].param is not None and bob.sip_uri in refer[0].param
        bob_call = await bob.wait_established(within=1)
        assert bob_call.peer_uri is not None and "alice" in bob_call.peer_uri
        await bob.hangup()
        await bob.wait_closed(within=5)
