"""Agent handoffs end to end: a baresip phone calls ``gateway run`` whose openai provider is ``gateway
fake-provider`` (real subprocesses, loopback only).

- the agent hands off: the fake answers the caller's first turn with a call of ``transfer_to_billing``; the new
  connection is configured as the billing profile (its instructions, voice and tools), is re-seeded with what
  was said, and the caller's audio reaches the providers once, in order, across the switch;
- the ops API hands off (``POST /v1/calls/{id}/handoff``), and a handoff to a profile whose provider refuses is
  answered 409 while the agent keeps the call;
- the agent hands off to a profile whose provider refuses: the old agent keeps the call and its tool output says
  the handoff failed.

Every client event the gateway sent is validated against the openai SDK's models.
"""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.gateway_proc import GatewayProcess, start_gateway
from tests.e2e.provider_harness import (
    FakeProvider,
    bursts,
    caller_wav,
    only_call,
    session_counters,
    start_fake_provider,
)
from tests.gateway.providers.helpers import check_client_event
from tests.support.audio import align_and_correlate, read_wav, resample
from tests.support.baresip import BaresipPhone
from tests.support.fixtures import require_speech_tools
from tests.support.peers import require_binary
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(120)]

TURN_A = "Hello, I was charged twice for my order this month."
TURN_B = "My order number is four five six seven."
TURN_C = "Can you refund one of the charges please?"
FRAME_BYTES = 960  # 20 ms of 24 kHz PCM16
_HANDED_OFF = re.compile(r"call \S+: handed off support -> billing \(agent\) in (\d+) ms")
SUPPORT = "You are the support agent."
BILLING = "You are the billing agent. Handle invoices and refunds."


def _closed_port() -> int:
    """A loopback port nothing listens on: connections to it are refused."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _config(path: Path, *, handoffs: str) -> Path:
    path.write_text(
        f"""
[[routes]]
name = "all"
did = "*"
profile = "support"

[profiles.support]
provider = "openai"
instructions = {json.dumps(SUPPORT)}
voice = "alloy"
handoffs = {handoffs}

[profiles.billing]
provider = "openai"
instructions = {json.dumps(BILLING)}
voice = "ash"
handoffs = ["support"]

[profiles.broken]
provider = "gemini"
instructions = "Never reached."
"""
    )
    return path


async def _gateway(procs: ProcessGroup, tmp_path: Path, fake: FakeProvider, *, handoffs: str) -> GatewayProcess:
    config = _config(tmp_path / "gateway.toml", handoffs=handoffs)
    return await start_gateway(
        procs,
        env={
            "GATEWAY_PROVIDER": "openai",
            "GATEWAY_OPENAI_URL": fake.url,
            "OPENAI_API_KEY": "",
            "GATEWAY_GEMINI_URL": f"ws://127.0.0.1:{_closed_port()}/ws",
            "GEMINI_API_KEY": "",
            "GATEWAY_CONFIG": str(config),
        },
    )


def _require_peers() -> None:
    require_binary("baresip", package="baresip baresip-core")
    require_speech_tools()


def _events(detail: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [event for event in detail["event_list"] if event["type"] == kind]


async def _records(fake: FakeProvider) -> dict[int, dict[str, Any]]:
    records = {summary["id"]: await fake.record(summary["id"]) for summary in await fake.records()}
    for detail in records.values():
        for event in detail["event_list"]:
            check_client_event(event)
    return records


def _tool_names(update: dict[str, Any]) -> list[str]:
    return [tool["name"] for tool in update["session"].get("tools", [])]


def _replayed(detail: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation items a connection was seeded with before any caller audio."""
    items = []
    for event in detail["event_list"]:
        if event["type"] == "input_audio_buffer.append":
            break
        if event["type"] == "conversation.item.create":
            items.append(event["item"])
    return items


async def test_the_agent_hands_off_keeping_the_conversation_and_the_callers_audio(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    _require_peers()
    arguments = json.dumps({"reason": "billing question"})
    fake = await start_fake_provider(
        peer_procs,
        *("--mode", "tone", "--reply-ms", "400", "--tool-name", "transfer_to_billing", "--tool-arguments", arguments),
    )
    gateway = await _gateway(peer_procs, tmp_path, fake, handoffs='["billing"]')
    source = caller_wav(tmp_path / "caller.wav", [TURN_A, 1.5, TURN_B, 1.0, TURN_C, 1.5])
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=source, codecs=("pcmu",))
    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=15)
        await phone.wait_closed(within=60)
    counters = await session_counters(gateway)
    call = await only_call(gateway)
    records = await _records(fake)

    assert call["end_reason"] == "caller_hangup"
    assert sorted(records) == [1, 2], "one connection per agent"
    first, second = records[1], records[2]
    (update_1,) = _events(first, "session.update")[:1]
    assert update_1["session"]["instructions"] == SUPPORT
    assert "transfer_to_billing" in _tool_names(update_1)
    declared = next(t for t in update_1["session"]["tools"] if t["name"] == "transfer_to_billing")
    assert declared["parameters"]["required"] == ["reason"]

    # The billing agent: its own instructions, voice and tools ...
    update_2 = _events(second, "session.update")[0]
    assert update_2["session"]["instructions"] == BILLING
    assert update_2["session"]["audio"]["output"]["voice"] == "ash"
    assert "transfer_to_support" in _tool_names(update_2) and "transfer_to_billing" not in _tool_names(update_2)
    # ... seeded with what was said (the fake's transcript of turn A), and told why it has the call.
    replayed = _replayed(second)
    texts = [(item["role"], item["content"][0]["text"]) for item in replayed if item["type"] == "message"]
    assert texts[0][0] == "user" and texts[0][1].endswith("ms of caller audio]"), texts
    assert texts[-1][0] == "system" and "billing agent" in texts[-1][1] and "billing question" in texts[-1][1]
    assert all(item["type"] == "message" for item in replayed), "the handoff call itself is not replayed"
    # Nobody was sent a function output for the handoff: the old agent's connection was simply replaced.
    outputs = [
        e["item"] for e in _events(first, "conversation.item.create") if e["item"]["type"] == "function_call_output"
    ]
    assert outputs == []
    assert _events(second, "response.create"), "the billing agent was asked to take the conversation up"

    # The caller's audio went on across the switch: connection 1 + connection 2 == every frame sent, in order.
    audio = await fake.audio(1) + await fake.audio(2)
    assert len(audio) == int(counters["frames_to_provider"]) * FRAME_BYTES
    assert int(counters["frames_dropped"]) == 0
    received = np.frombuffer(audio, dtype="<i2").astype(np.float64) / 32768.0
    sent = read_wav(phone.last_recording().encoded)
    reference = resample(sent.samples, sent.rate, 24_000)
    playout = {key: call["stats"][key] for key in ("concealed", "discarded")}
    slip_s = 0.02 * min(playout["concealed"] + playout["discarded"], 10) + 0.005
    correlation, _lag = align_and_correlate(reference, received, 24_000, max_slip_seconds=slip_s)
    assert correlation >= 0.9, f"caller audio at the providers correlates {correlation:.3f}; playout {playout}"
    handoff_at = len(await fake.audio(1)) / FRAME_BYTES * 0.02
    assert len(received) / 24_000 > handoff_at + 3.0, "too little caller audio after the handoff to check"

    # One handoff, logged with how long the new agent's setup took (the caller's audio went to the old agent
    # meanwhile).
    assert len(_HANDED_OFF.findall(gateway.process.output)) == 1

    # The caller heard the billing agent.
    completed = [e for e in second["timeline"] if e["dir"] == "out" and e["type"] == "response.done"]
    assert completed, "the billing agent never answered"
    heard = bursts(read_wav(phone.last_recording().decoded))
    assert heard, "the caller heard no agent"

    # The record keeps the handoff (its profile stays the one the route gave the call).
    assert call["profile"] == "support"
    (line,) = call["handoffs"]
    assert (line["from_profile"], line["to_profile"], line["ok"], line["initiator"]) == (
        "support",
        "billing",
        True,
        "agent",
    )
    assert line["reason"] == "billing question"


async def test_the_ops_api_hands_off_and_a_refusing_provider_is_answered_409(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    _require_peers()
    fake = await start_fake_provider(peer_procs, *("--mode", "tone", "--reply-ms", "300"))
    gateway = await _gateway(peer_procs, tmp_path, fake, handoffs="[]")
    source = caller_wav(tmp_path / "caller.wav", [TURN_A, 30.0])
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=source, codecs=("pcmu",))
    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=15)
        await fake.wait_for(bool, within=20, what="the first connection")
        calls = await gateway.api("GET", "/v1/calls", params={"state": "active"})
        (live,) = calls["items"] if isinstance(calls, dict) else calls
        call_id = live["id"]
        async with gateway.client() as client:
            await fake.wait_for_record(1, lambda d: bool(_events(d, "session.update")), within=15, what="setup")
            handed = await client.post(f"/v1/calls/{call_id}/handoff", json={"profile": "billing", "reason": "ops"})
            assert handed.status_code == 204, handed.text
            summaries = await fake.wait_for(lambda s: len(s) >= 2, within=15, what="the billing connection")
            second = await fake.wait_for_record(
                summaries[1]["id"], lambda d: bool(_events(d, "session.update")), within=15, what="its setup"
            )
            assert _events(second, "session.update")[0]["session"]["instructions"] == BILLING
            assert any("ops" in item["content"][0]["text"] for item in _replayed(second) if item["role"] == "system")

            refused = await client.post(f"/v1/calls/{call_id}/handoff", json={"profile": "broken"})
            assert refused.status_code == 409, refused.text
            assert "handoff to 'broken' failed" in refused.json()["error"]["message"]
            unknown = await client.post(f"/v1/calls/{call_id}/handoff", json={"profile": "nobody"})
            assert unknown.status_code == 409 and "no profile 'nobody'" in unknown.json()["error"]["message"]
            bad = await client.post(f"/v1/calls/{call_id}/handoff", json={"profile": ""})
            assert bad.status_code == 422
            missing = await client.post("/v1/calls/c-000000000000/handoff", json={"profile": "billing"})
            assert missing.status_code == 404

            # The billing agent still has the call: caller audio keeps reaching its connection.
            before = (await fake.record(2))["audio_bytes"]
            await fake.wait_for_record(
                2, lambda d: d["audio_bytes"] >= before + 50 * FRAME_BYTES, within=10, what="caller audio"
            )
            assert (await client.post(f"/v1/calls/{call_id}/hangup")).status_code == 204
        await phone.wait_closed(within=30)
    call = await only_call(gateway)
    assert [(h["to_profile"], h["ok"], h["initiator"]) for h in call["handoffs"]] == [
        ("billing", True, "api"),
        ("broken", False, "api"),
    ]
    assert len(await fake.records()) == 2
    async with gateway.client() as client:
        ended = await client.post(f"/v1/calls/{call_id}/handoff", json={"profile": "billing"})
    assert ended.status_code == 409 and "ended" in ended.json()["error"]["message"]


async def test_a_handoff_to_a_refusing_provider_keeps_the_old_agent_and_tells_it(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    _require_peers()
    arguments = json.dumps({"reason": "needs the other team"})
    fake = await start_fake_provider(
        peer_procs,
        *("--mode", "tone", "--reply-ms", "400", "--tool-name", "transfer_to_broken", "--tool-arguments", arguments),
    )
    gateway = await _gateway(peer_procs, tmp_path, fake, handoffs='["broken"]')
    source = caller_wav(tmp_path / "caller.wav", [TURN_A, 1.5, TURN_B, 1.5])
    phone = BaresipPhone(peer_procs, tmp_path, source_wav=source, codecs=("pcmu",))
    async with phone:
        await phone.dial(gateway.sip_uri)
        await phone.wait_established(within=15)
        await phone.wait_closed(within=60)
    counters = await session_counters(gateway)
    call = await only_call(gateway)
    records = await _records(fake)
    assert sorted(records) == [1], "the old agent kept its connection"
    first = records[1]
    outputs = [
        e["item"] for e in _events(first, "conversation.item.create") if e["item"]["type"] == "function_call_output"
    ]
    (output,) = outputs
    assert "the handoff to broken failed" in json.loads(output["output"])["error"]
    # The old agent answered after being told, and heard the caller's second turn.
    assert len(_events(first, "response.create")) >= 1
    assert first["audio_bytes"] == int(counters["frames_to_provider"]) * FRAME_BYTES
    assert call["end_reason"] == "caller_hangup" and call["profile"] == "support"
    (line,) = call["handoffs"]
    assert (line["to_profile"], line["ok"]) == ("broken", False) and line["error"]
