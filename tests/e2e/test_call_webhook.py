"""The call-time application webhook end to end: ``gateway run`` (openai provider on ``gateway fake-provider``) asks
a small Starlette application on 127.0.0.1, which verifies each request's signature with `standardwebhooks`, before
answering baresip's calls.

- The application's accept picks the ``vip`` profile and writes instructions naming the caller's number: the fake
  provider's recorded ``session.update`` carries them.
- Its reject 486 reaches baresip as 486; a browser's offer (with a call token's metadata) gets a 403 naming it.
- An application slower than the route's deadline: the caller hears 180 Ringing meanwhile, then the route's own
  (echo) profile answers and the caller hears its own speech.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.e2e.provider_harness import FakeProvider, start_fake_provider
from tests.gateway.fleet.servers import serve
from tests.gateway.worker.test_webrtc_api import OFFER  # a browser's offer: the API never gets to ICE
from tests.support.audio import align_and_correlate, read_wav
from tests.support.baresip import BaresipPhone
from tests.support.call_hook_app import CallHookApp
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]

SECRET = "e2e-call-hook-secret"
CALLER = "+15550111"


def _config(app_url: str) -> str:
    return f"""
[[routes]]
name = "vip"
did = "+15550100"
profile = "agent"
application = {{ url = {json.dumps(app_url + "/call")} }}

[[routes]]
name = "slow"
did = "+15550200"
profile = "echo_agent"
application = {{ url = {json.dumps(app_url + "/call")}, timeout_s = 1.0 }}

[[routes]]
name = "busy"
did = "+15550300"
profile = "agent"
application = {{ url = {json.dumps(app_url + "/call")} }}

[profiles.agent]
provider = "openai"
instructions = "The route's own instructions."

[profiles.vip]
provider = "openai"
instructions = "unused: the application writes them"

[profiles.echo_agent]
provider = "echo"
"""


async def _decide(body: dict[str, Any]) -> tuple[int, Any]:
    route = body["route"]
    if route == "vip":
        return 200, {
            "action": "accept",
            "profile": "vip",
            "instructions": f"A VIP calls from {body['context']['caller_number']}; greet them as {{caller_number}}.",
        }
    if route == "slow":
        await asyncio.sleep(5.0)  # past the route's 1 s deadline: the answer comes too late to count
        return 200, {"action": "reject", "status": 603}
    return 200, {"action": "reject", "status": 486, "reason": "Busy Here"}


async def _gateway(peer_procs: ProcessGroup, tmp_path: Path, app_url: str) -> tuple[GatewayProcess, FakeProvider]:
    fake = await start_fake_provider(peer_procs)
    config = tmp_path / "gateway.toml"
    config.write_text(_config(app_url))
    gateway = await start_gateway(
        peer_procs,
        env={
            "GATEWAY_PROVIDER": "openai",
            "GATEWAY_OPENAI_URL": fake.url,
            "OPENAI_API_KEY": "",
            "GATEWAY_CONFIG": str(config),
            "GATEWAY_WEBHOOK_SECRET": SECRET,
        },
    )
    return gateway, fake


def _dial(gateway: GatewayProcess, number: str) -> str:
    return gateway.sip_uri.replace("agent@", f"{number}@")


async def test_the_application_picks_the_profile_and_rejects_callers(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    hook = CallHookApp(_decide, secret=SECRET)
    async with serve(hook.app()) as app_url:
        gateway, fake = await _gateway(peer_procs, tmp_path, app_url)
        phone = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, user=CALLER, tail_silence=30.0)
        async with phone:
            await phone.dial(_dial(gateway, "+15550100"))
            await phone.wait_established(within=15)
            summaries = await fake.wait_for(bool, within=30, what="connection")
            detail = await fake.wait_for_record(
                summaries[0]["id"],
                lambda d: any(e["type"] == "session.update" for e in d["event_list"]),
                within=30,
                what="session.update",
            )
            await phone.hangup()
            await phone.wait_closed(within=10)

            await phone.dial(_dial(gateway, "+15550300"))
            closed = await phone.wait_closed(within=15, nth=2)

        async with gateway.client() as client:
            token = (
                await client.post("/v1/webrtc/tokens", json={"route": "busy", "metadata": {"plan": "gold"}})
            ).json()["token"]
            refused = await client.post(
                "/v1/webrtc/offer",
                json={"sdp": OFFER, "type": "offer"},
                headers={"Authorization": f"Bearer {token}"},
            )

    update = next(e for e in detail["event_list"] if e["type"] == "session.update")
    assert update["session"]["instructions"] == f'A VIP calls from {CALLER}; greet them as "{CALLER}".'
    assert hook.unsigned == 0  # every request verified against GATEWAY_WEBHOOK_SECRET
    first = hook.requests[0]
    assert (first["route"], first["kind"], first["profile"]) == ("vip", "sip", "agent")
    assert first["context"]["caller_number"] == CALLER and first["context"]["called_number"] == "+15550100"

    assert closed.param is not None and "486" in closed.param, closed.raw

    assert refused.status_code == 403, refused.text
    error = refused.json()["error"]
    assert error["code"] == "application_rejected" and "486 (Busy Here)" in error["message"]
    browser = hook.requests[-1]
    assert browser["kind"] == "webrtc" and browser["context"]["metadata"] == {"plan": "gold"}

    calls = await gateway.api("GET", "/v1/calls", params={"state": "ended"})
    items = calls["items"] if isinstance(calls, dict) else calls
    assert sorted(call["route"] for call in items) == ["vip"]  # refused calls were never answered


async def test_a_slow_application_rings_then_the_routes_profile_answers(
    peer_procs: ProcessGroup, tmp_path: Path, speech_8k: Path
) -> None:
    require_binary("baresip", package="baresip baresip-core")
    hook = CallHookApp(_decide, secret=SECRET)
    async with serve(hook.app()) as app_url:
        gateway, _ = await _gateway(peer_procs, tmp_path, app_url)
        phone = BaresipPhone(peer_procs, tmp_path, source_wav=speech_8k, user=CALLER, tail_silence=1.5)
        async with phone:
            dialled = time.monotonic()
            await phone.dial(_dial(gateway, "+15550200"))
            ringing = await phone.wait_event("CALL_RINGING", within=10)
            established = await phone.wait_established(within=15)
            await phone.wait_closed(within=40)
    # Rung while the application was asked; answered at the route's 1 s deadline, not the application's 5 s.
    assert ringing.at < established.at
    assert 0.9 <= established.at - dialled < 4.0, established.at - dialled
    sent = read_wav(speech_8k)
    heard = read_wav(phone.last_recording().decoded)
    correlation, _ = align_and_correlate(sent.samples, heard.samples, 8000, max_slip_seconds=0.25)
    assert correlation >= 0.9, f"echo correlation {correlation:.3f}"
    assert len(hook.requests) == 1 and hook.requests[0]["route"] == "slow"
