"""Warm transfer to a human, with real phones: baresip is the caller, pjsua2 the human (gateway/worker/warm.py).

Every party sends a tone of its own, so what each one heard says who reached it: the agent (the fake provider)
answers with 440 Hz, the gateway's hold audio is 660 Hz, the caller sends 1500 Hz, the human 1000 Hz.

- Transferred: ``POST /v1/calls/{id}/warm_transfer`` with a summary. The human hears the briefing (the second
  provider connection, whose response was asked with the summary) and no hold audio; then caller and human hear
  each other's tone; the caller hears no agent audio after the human's; both provider connections are closed; the
  human hangs up and the caller gets a BYE; events and both call records tell it. Digits cross the bridge both
  ways as RFC 4733 events (a human's IVR asking the caller for a PIN).
- Conversation (``briefing: conversation``): the human's audio goes to the briefing session, which answers them
  and then calls ``connect_caller``; the caller, on hold meanwhile, hears none of it, then the two hear each other.
  Or the briefing session calls ``decline_transfer``: the human's call ends and the caller hears the agent again.
- Busy: the human's phone answers 486. The caller comes off hold and the agent, told why, speaks again: its
  audio reaches the caller after the hold audio.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.e2e.ops_support import EventStream, poll
from tests.e2e.provider_harness import FakeProvider, start_fake_provider, start_gateway_on_fake
from tests.support.audio import Wav, read_wav, silence, to_mono, tone, write_wav
from tests.support.baresip import BaresipPhone
from tests.support.peers import require_binary, require_module
from tests.support.pjsua import PjsuaPhone
from tests.support.procs import ProcessGroup

pytestmark = [pytest.mark.peer, pytest.mark.timeout(150)]

AGENT_HZ, HOLD_HZ, CALLER_HZ, HUMAN_HZ = 440.0, 660.0, 1500.0, 1000.0
SUMMARY = "Caller Ada Lovelace wants to move her order 4567 to Friday."


def write_bytes(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _require_peers() -> None:
    require_module("pjsua2", package="pjsua2 (the test extra)")
    require_binary("baresip", package="baresip baresip-core")


def heard_at(wav: Wav, hz: float, *, window_s: float = 0.1, level: float = 0.02) -> list[float]:
    """Where in the recording ``hz`` is the loudest sound: the start of each such window, in seconds."""
    mono = to_mono(wav.samples)
    n = int(window_s * wav.rate)
    freqs = np.fft.rfftfreq(n, 1 / wav.rate)
    window = np.hanning(n)
    found = []
    for start in range(0, mono.size - n, n):
        piece = mono[start : start + n]
        if float(np.sqrt(np.mean(piece**2))) < level:
            continue
        peak = float(freqs[int(np.argmax(np.abs(np.fft.rfft(piece * window))))])
        if abs(peak - hz) <= 25.0:
            found.append(start / wav.rate)
    return found


async def _live_call(gateway: Any) -> dict[str, Any]:
    async def one() -> dict[str, Any] | None:
        calls = await gateway.api("GET", "/v1/calls")
        items = calls["items"] if isinstance(calls, dict) else calls
        live = [c for c in items if c["state"] != "ended"]
        return live[0] if live else None

    return await poll(one, within=15, what="a live call")


async def _greeted(fake: FakeProvider) -> None:
    await fake.wait_for(lambda s: bool(s) and len(s[0]["responses"]) >= 1, within=15, what="the agent's greeting")


async def _conversation_transfer(
    gateway: Any, fake: FakeProvider, stream: EventStream, caller: BaresipPhone, human: PjsuaPhone
) -> tuple[dict[str, Any], Any]:
    """The caller dials in and is greeted; a conversational warm transfer to the human starts: the caller's call
    and the event that ended the briefing (``call.transferred`` or ``call.transfer_failed``)."""
    await caller.dial(gateway.sip_uri)
    await caller.wait_established(within=15)
    call = await _live_call(gateway)
    await _greeted(fake)
    body = {"target": human.sip_uri, "summary": SUMMARY, "briefing": "conversation"}
    started = await gateway.api("POST", f"/v1/calls/{call['id']}/warm_transfer", json=body)
    assert started["state"] == "dialling" and started["briefing"] == "conversation", started
    done = await stream.wait_for(
        lambda e: e.type in ("call.transferred", "call.transfer_failed") and e.call_id == call["id"], within=30
    )
    return call, done


async def _agent_spoke_after_the_note(gateway: Any, call_id: str, why: str) -> None:
    """The failed transfer's system note (naming ``why``) is on the call, and the agent's reply after it was
    played out; the call goes on with the transfer line failed."""

    async def spoke_again() -> dict[str, Any] | None:
        record: dict[str, Any] = await gateway.api("GET", f"/v1/calls/{call_id}")
        lines = record["transcript"]
        notes = [i for i, t in enumerate(lines) if t["role"] == "system" and why in t["text"]]
        after = [t for t in lines[notes[0] :] if t["role"] == "assistant" and t["end_s"]] if notes else []
        return record if after else None

    record = await poll(spoke_again, within=15, what=f"the agent's reply after the note naming {why!r}")
    assert record["state"] == "active" and record["transfer"]["state"] == "failed", record["transfer"]


async def _start(
    procs: ProcessGroup, tmp_path: Path, *, record: str = "off", fake_args: tuple[str, ...] = ()
) -> tuple[FakeProvider, Any]:
    fake = await start_fake_provider(procs, "--mode", "tone", "--reply-ms", "800", *fake_args)
    music = write_wav(tmp_path / "hold.wav", tone(HOLD_HZ, 0.5, 16000, amplitude=0.3), 16000)
    gateway = await start_gateway_on_fake(
        procs,
        tmp_path,
        fake,
        env={"GATEWAY_HOLD_AUDIO_FILE": str(music)},
        profile_lines=('greeting = "Hello, how can I help?"', f'record = "{record}"'),
    )
    return fake, gateway


async def test_the_human_is_briefed_then_hears_the_caller_and_the_agent_leaves(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    _require_peers()
    fake, gateway = await _start(peer_procs, tmp_path, record="both")
    human_says = write_wav(
        tmp_path / "human.wav",
        np.concatenate(
            [silence(3.5, 8000).reshape(-1), tone(HUMAN_HZ, 3.0, 8000, amplitude=0.4), silence(6.0, 8000).reshape(-1)]
        ),
        8000,
    )
    human = PjsuaPhone(
        peer_procs,
        tmp_path,
        mode="callee",
        name="human",
        play=human_says,
        hangup_after=8.0,
        codecs=("PCMU",),
        dtmf=[(6.5, "9")],  # after the join (the caller hears >= 2 s of the human's tone, which ends at 6.5 s)
    )
    caller_says = write_wav(
        tmp_path / "caller.wav",
        np.concatenate(
            [silence(6.0, 8000).reshape(-1), tone(CALLER_HZ, 4.0, 8000, amplitude=0.4), silence(10.0, 8000).reshape(-1)]
        ),
        8000,
    )
    caller = BaresipPhone(peer_procs, tmp_path, source_wav=caller_says, codecs=("pcmu",), lifetime=90)
    async with EventStream(gateway.http, gateway.token, last_event_id=0, name="sse") as stream, human, caller:
        await caller.dial(gateway.sip_uri)
        await caller.wait_established(within=15)
        call = await _live_call(gateway)
        await _greeted(fake)
        async with gateway.client() as client:
            path = f"/v1/calls/{call['id']}/warm_transfer"
            assert (await client.post("/v1/calls/c-nosuchcall/warm_transfer", json={"target": "x"})).status_code == 404
            assert (await client.post(path, json={})).status_code == 422
            started = await client.post(path, json={"target": human.sip_uri, "summary": SUMMARY})
            assert started.status_code == 202, started.text
            line = started.json()
            assert line["state"] == "dialling" and line["caller_leg"] == call["id"], line
            again = await client.post(path, json={"target": human.sip_uri})
            assert again.status_code == 409 and "warm transfer wt-" in again.text, again.text
        await stream.wait_for(lambda e: e.type == "call.transfer_started" and e.call_id == call["id"], within=10)
        done = await stream.wait_for(
            lambda e: e.type in ("call.transferred", "call.transfer_failed") and e.call_id == call["id"], within=30
        )
        assert done.type == "call.transferred", done
        await human.wait_state("CONFIRMED", within=5)
        await caller.send_dtmf("42")  # joined: the agent that took digits has left, the human's phone gets them
        assert await caller.wait_dtmf("9", within=10) == "9"
        assert await human.wait_done(within=30) == 0  # the human hangs up ...
        await caller.wait_closed(within=15)  # ... and the caller gets a BYE

    assert human.received_dtmf() == "42"
    # The briefing: the second provider connection was asked to speak the summary, and the human heard it.
    records = await fake.wait_for(lambda s: len(s) == 2 and all(r["ended_at"] for r in s), within=15, what="ends")
    briefing = await fake.record(records[1]["id"])
    asked = [e for e in briefing["event_list"] if e.get("type") == "response.create"]
    assert any(SUMMARY in str(e) for e in asked), asked
    heard_by_human = read_wav(human.recording)  # type: ignore[arg-type]
    brief, from_caller = heard_at(heard_by_human, AGENT_HZ), heard_at(heard_by_human, CALLER_HZ)
    assert brief and from_caller, (brief, from_caller)
    assert max(brief) < min(from_caller), "the human heard the agent after the caller was joined"
    assert not heard_at(heard_by_human, HOLD_HZ), "the human heard the caller's hold audio"
    assert len(from_caller) >= 20, from_caller  # >= 2 s of the caller's 4 s tone

    # The caller: the agent, the hold audio, then the human, and never the agent again.
    heard_by_caller = read_wav(caller.last_recording().decoded)
    agent, hold, from_human = (heard_at(heard_by_caller, hz) for hz in (AGENT_HZ, HOLD_HZ, HUMAN_HZ))
    assert agent and hold and from_human, (agent, hold, from_human)
    assert max(agent) < min(from_human) and max(hold) < min(from_human), (agent, hold, from_human)
    assert len(from_human) >= 20, from_human  # >= 2 s of the human's 3 s tone

    # Both legs on the record: the caller's call names the human's, which is a call of its own.
    record = await gateway.api("GET", f"/v1/calls/{call['id']}")
    transfer = record["transfer"]
    assert transfer["state"] == "ended" and transfer["outcome"] == "human_hangup" and transfer["briefed"], transfer
    assert record["end_reason"] == "human_hangup", record["end_reason"]
    other = await gateway.api("GET", f"/v1/calls/{transfer['human_leg']}")
    assert other["direction"] == "outbound" and other["transfer"]["id"] == transfer["id"], other
    # The caller's recording went on across the bridge: the caller's side and, on the other, the human's.
    async with gateway.client() as client:
        wav = await client.get(f"/v1/calls/{call['id']}/recording")
    assert wav.status_code == 200, wav.text
    recorded = read_wav(write_bytes(tmp_path / "recorded.wav", wav.content))
    sides = [Wav(samples=recorded.samples[:, side : side + 1], rate=recorded.rate) for side in (0, 1)]
    assert heard_at(sides[0], CALLER_HZ) and not heard_at(sides[0], HUMAN_HZ), "the caller's side"
    assert heard_at(sides[1], HUMAN_HZ) and heard_at(sides[1], AGENT_HZ), "what the caller heard: agent, human"
    output = gateway.process.output
    assert f"warm transfer {transfer['id']}: bridged with {transfer['human_leg']} (briefed=True)" in output
    assert "frames and 3 digits (human_hangup)" in output


def _human_turns(tmp_path: Path, *turns: tuple[float, float]) -> Path:
    """The human's side: the 1000 Hz tone in each (start s, length s), silence between, up to 30 s."""
    samples = silence(30.0, 8000).reshape(-1).copy()
    for start, length in turns:
        piece = tone(HUMAN_HZ, length, 8000, amplitude=0.4)
        at = int(start * 8000)
        samples[at : at + piece.size] = piece
    return write_wav(tmp_path / "human.wav", samples, 8000)


async def test_a_conversation_answers_the_human_then_connects_the_caller(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    """The briefing session on the human's leg hears the human: it answers their first turn (a 440 Hz reply) and
    calls connect_caller on their second; then caller and human hear each other. The caller, on hold, never hears
    the briefing conversation."""
    _require_peers()
    fake, gateway = await _start(peer_procs, tmp_path, fake_args=("--tool-name", "connect_caller", "--tool-turn", "2"))
    # Two turns to the briefing agent (at 2.0 s and 4.6 s of the human's call), then talk to the caller from 8 s.
    says = _human_turns(tmp_path, (2.0, 0.8), (4.6, 0.8), (8.0, 4.0))
    human = PjsuaPhone(
        peer_procs, tmp_path, mode="callee", name="human", play=says, hangup_after=16.0, codecs=("PCMU",)
    )
    quiet, talk = silence(13.0, 8000).reshape(-1), tone(CALLER_HZ, 4.0, 8000, amplitude=0.4)
    caller_says = write_wav(tmp_path / "caller.wav", np.concatenate([quiet, talk, quiet]), 8000)
    caller = BaresipPhone(peer_procs, tmp_path, source_wav=caller_says, codecs=("pcmu",), lifetime=90)
    async with EventStream(gateway.http, gateway.token, last_event_id=0, name="sse") as stream, human, caller:
        call, done = await _conversation_transfer(gateway, fake, stream, caller, human)
        assert done.type == "call.transferred", done.subject.get("transfer")
        transfer = done.subject["transfer"]
        assert transfer["briefing"] == "conversation" and transfer["briefed"], transfer
        async with gateway.client() as client:  # joined: there is no transfer in briefing any more
            late = await client.post(f"/v1/calls/{call['id']}/warm_transfer/join")
        assert late.status_code == 409 and "not briefing" in late.text, late.text
        assert await human.wait_done(within=30) == 0
        await caller.wait_closed(within=15)

    # The briefing connection heard the human (their turns were appended to it) and connected the caller.
    records = await fake.wait_for(lambda s: len(s) == 2 and all(r["ended_at"] for r in s), within=15, what="ends")
    briefing = await fake.record(records[1]["id"])
    assert any(SUMMARY in str(e) for e in briefing["event_list"] if e.get("type") == "response.create")
    appended = [e for e in briefing["event_list"] if e.get("type") == "input_audio_buffer.append"]
    assert len(appended) >= 50, len(appended)  # >= 1 s of the human's audio in 20 ms appends
    pcm = np.frombuffer(await fake.audio(records[1]["id"]), dtype="<i2").reshape(-1, 1)
    assert len(heard_at(Wav(samples=pcm, rate=24000), HUMAN_HZ)) >= 10, "the human's turns never reached it"
    (output,) = briefing["tool_outputs"]
    assert '"status": "connecting"' in str(output), output
    # The human: the briefing and the answer to their turn (two 800 ms replies), then the caller.
    heard_by_human = read_wav(human.recording)  # type: ignore[arg-type]
    agent, from_caller = heard_at(heard_by_human, AGENT_HZ), heard_at(heard_by_human, CALLER_HZ)
    assert len(agent) >= 12 and len(from_caller) >= 20, (agent, from_caller)
    assert max(agent) < min(from_caller), (agent, from_caller)
    # The caller: their agent's greeting, the hold audio, then the human; none of the briefing conversation.
    heard_by_caller = read_wav(caller.last_recording().decoded)
    agent, hold, from_human = (heard_at(heard_by_caller, hz) for hz in (AGENT_HZ, HOLD_HZ, HUMAN_HZ))
    assert hold and len(from_human) >= 20, (hold, from_human)
    assert len(agent) <= 9, f"the caller heard more than the greeting's 800 ms of agent: {agent}"
    assert max(hold) < min(from_human), (hold, from_human)
    assert f"warm transfer {transfer['id']}: joined by the agent" in gateway.process.output
    # The conversation is on the human's call record: their turns, the agent's replies, its tool call.
    other = await gateway.api("GET", f"/v1/calls/{transfer['human_leg']}")
    roles = [line["role"] for line in other["transcript"]]
    assert roles.count("user") >= 2 and roles.count("assistant") >= 2, other["transcript"]
    assert [tool["name"] for tool in other["tools"]] == ["connect_caller"], other["tools"]


async def test_a_declined_conversation_gives_the_caller_back_to_the_agent(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    """The briefing session calls decline_transfer on the human's first turn: the human's call ends, the caller
    comes off hold, and their agent, told the reason, speaks to them again."""
    _require_peers()
    arguments = json.dumps({"reason": "I am off shift"})
    fake, gateway = await _start(
        peer_procs, tmp_path, fake_args=("--tool-name", "decline_transfer", "--tool-arguments", arguments)
    )
    says = _human_turns(tmp_path, (2.0, 0.8))
    human = PjsuaPhone(peer_procs, tmp_path, mode="callee", name="human", play=says, max_seconds=60, codecs=("PCMU",))
    quiet = write_wav(tmp_path / "quiet.wav", silence(40.0, 8000), 8000)
    caller = BaresipPhone(peer_procs, tmp_path, source_wav=quiet, codecs=("pcmu",), lifetime=90)
    async with EventStream(gateway.http, gateway.token, last_event_id=0, name="sse") as stream, human, caller:
        call, failed = await _conversation_transfer(gateway, fake, stream, caller, human)
        transfer = failed.subject["transfer"]
        assert failed.type == "call.transfer_failed", transfer
        assert (transfer["outcome"], transfer["declined_reason"]) == ("declined", "I am off shift"), transfer
        assert await human.wait_done(within=15) == 0  # the gateway ended the human's call
        await _agent_spoke_after_the_note(gateway, call["id"], "I am off shift")
        await caller.hangup()
        await caller.wait_closed(within=10)

    # The caller heard the hold audio, then the agent again (greeting + the reply: two 800 ms replies).
    heard_by_caller = read_wav(caller.last_recording().decoded)
    agent, hold = heard_at(heard_by_caller, AGENT_HZ), heard_at(heard_by_caller, HOLD_HZ)
    assert hold and len(agent) >= 12 and max(agent) > max(hold), (agent, hold)
    other = await gateway.api("GET", f"/v1/calls/{transfer['human_leg']}")
    assert other["end_reason"] == "transfer_declined", other["end_reason"]


async def test_a_busy_human_brings_the_caller_back_to_the_agent(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    _require_peers()
    fake, gateway = await _start(peer_procs, tmp_path)
    human = PjsuaPhone(peer_procs, tmp_path, mode="callee", name="human", answer_code=486, max_seconds=60)
    quiet = write_wav(tmp_path / "quiet.wav", silence(30.0, 8000), 8000)
    caller = BaresipPhone(peer_procs, tmp_path, source_wav=quiet, codecs=("pcmu",), lifetime=90)
    async with EventStream(gateway.http, gateway.token, last_event_id=0, name="sse") as stream, human, caller:
        await caller.dial(gateway.sip_uri)
        await caller.wait_established(within=15)
        call = await _live_call(gateway)
        await _greeted(fake)
        started = await gateway.api(
            "POST", f"/v1/calls/{call['id']}/warm_transfer", json={"target": human.sip_uri, "summary": SUMMARY}
        )
        assert started["state"] == "dialling", started
        await human.wait_event("rejected", within=15)
        failed = await stream.wait_for(
            lambda e: e.type == "call.transfer_failed" and e.call_id == call["id"], within=15
        )
        assert failed.subject["transfer"]["outcome"] == "sip_486", failed.subject
        await _agent_spoke_after_the_note(gateway, call["id"], "line was busy")  # told why, it answers
        await caller.hangup()
        await caller.wait_closed(within=10)

    # The caller heard the agent's reply too: two 800 ms replies (the greeting, then the busy news), where the
    # greeting alone is at most eight 100 ms windows. (The 486 comes too soon for the hold audio to be heard.)
    agent = heard_at(read_wav(caller.last_recording().decoded), AGENT_HZ)
    assert len(agent) >= 12, agent
    records = await fake.records()
    assert len(records) == 1, "a busy human costs no briefing connection"


async def test_the_agents_tool_transfers_the_caller(peer_procs: ProcessGroup, tmp_path: Path) -> None:
    _require_peers()
    human = PjsuaPhone(peer_procs, tmp_path, mode="callee", name="human", hangup_after=4.0, codecs=("PCMU",))
    arguments = json.dumps({"target": human.sip_uri, "summary": SUMMARY})
    # The fake answers the caller's first turn with a call of warm_transfer; the profile offers it (opt-in).
    fake = await start_fake_provider(
        peer_procs,
        *("--mode", "tone", "--reply-ms", "600", "--tool-name", "warm_transfer"),
        "--tool-arguments",
        arguments,
    )
    gateway = await start_gateway_on_fake(
        peer_procs, tmp_path, fake, extra_toml='\n[[profiles.agent.tools]]\nname = "warm_transfer"\n'
    )
    turn = np.concatenate(
        [silence(1.0, 8000).reshape(-1), tone(CALLER_HZ, 0.8, 8000, amplitude=0.4), silence(20.0, 8000).reshape(-1)]
    )
    caller = BaresipPhone(peer_procs, tmp_path, source_wav=write_wav(tmp_path / "turn.wav", turn, 8000), lifetime=90)
    async with EventStream(gateway.http, gateway.token, last_event_id=0, name="sse") as stream, human, caller:
        await caller.dial(gateway.sip_uri)
        await caller.wait_established(within=15)
        call = await _live_call(gateway)
        done = await stream.wait_for(
            lambda e: e.type in ("call.transferred", "call.transfer_failed") and e.call_id == call["id"], within=30
        )
        assert done.type == "call.transferred", done.subject.get("transfer")
        transfer = done.subject["transfer"]
        assert transfer["initiator"] == "agent" and transfer["briefed"] and transfer["target"] == human.sip_uri
        assert await human.wait_done(within=30) == 0
        await caller.wait_closed(within=15)

    records = await fake.records()
    assert len(records) == 2
    (output,) = records[0]["tool_outputs"]
    assert '"status": "dialling"' in str(output), output
    briefing = await fake.record(records[1]["id"])
    assert any(SUMMARY in str(e) for e in briefing["event_list"] if e.get("type") == "response.create")
    assert heard_at(read_wav(human.recording), AGENT_HZ), "the human heard no briefing"  # type: ignore[arg-type]


async def test_a_joined_call_is_handed_off_with_refer_and_the_phones_talk_directly(
    peer_procs: ProcessGroup, tmp_path: Path
) -> None:
    """GATEWAY_WARM_TRANSFER_REFER=auto and a caller whose INVITE offers REFER and Replaces (pjsua2 does): once
    joined, the gateway REFERs the caller to the human with a Replaces of its dialog with the human. The caller's
    phone calls the human directly, the human's phone takes that call in place of the gateway's, and the gateway
    ends both its legs: no live call is left on it while the two phones go on hearing each other's tone."""
    require_module("pjsua2", package="pjsua2 (the test extra)")
    fake = await start_fake_provider(peer_procs, "--mode", "tone", "--reply-ms", "800")
    gateway = await start_gateway_on_fake(
        peer_procs, tmp_path, fake, env={"GATEWAY_WARM_TRANSFER_REFER": "auto"}, profile_lines=('greeting = "Hi."',)
    )
    human = PjsuaPhone(
        peer_procs,
        tmp_path,
        mode="callee",
        name="human",
        user="human",
        play=write_wav(tmp_path / "human.wav", tone(HUMAN_HZ, 40.0, 8000, amplitude=0.4), 8000),
        hangup_after=16.0,
        max_seconds=60,
        codecs=("PCMU",),
        follow_transfer=True,
    )
    caller = PjsuaPhone(
        peer_procs,
        tmp_path,
        mode="caller",
        name="caller",
        uri=gateway.sip_uri,
        play=write_wav(tmp_path / "caller.wav", tone(CALLER_HZ, 40.0, 8000, amplitude=0.4), 8000),
        max_seconds=60,
        codecs=("PCMU",),
        follow_transfer=True,
    )
    async with EventStream(gateway.http, gateway.token, last_event_id=0, name="sse") as stream, human, caller:
        await caller.wait_state("CONFIRMED", within=15)
        call = await _live_call(gateway)
        await _greeted(fake)
        started = await gateway.api(
            "POST", f"/v1/calls/{call['id']}/warm_transfer", json={"target": human.sip_uri, "summary": SUMMARY}
        )
        done = await stream.wait_for(
            lambda e: e.type in ("call.transferred", "call.transfer_failed") and e.call_id == call["id"], within=30
        )
        assert done.type == "call.transferred", done.subject.get("transfer")
        xfer = await caller.wait_event("xfer_request", within=10)
        assert f"@127.0.0.1:{human.sip_port}" in str(xfer.get("to")) and "Replaces=" in str(xfer.get("to")), xfer
        replaced = await human.wait_event("replaced", within=10)

        async def legs_gone() -> dict[str, Any] | None:
            calls = await gateway.api("GET", "/v1/calls")
            items = calls["items"] if isinstance(calls, dict) else calls
            return None if [c for c in items if c["state"] != "ended"] else {"items": items}

        await poll(legs_gone, within=10, what="both of the gateway's legs ended")
        assert human.process is not None and human.process.running, "the human's phone is still in a call"
        assert caller.process is not None and caller.process.running, "the caller's phone is still in a call"
        assert await human.wait_done(within=30) == 0  # the human hangs up the direct call ...
        assert await caller.wait_done(within=15) == 0  # ... and the caller's phone sees it end

    record = await gateway.api("GET", f"/v1/calls/{call['id']}")
    transfer = record["transfer"]
    assert (transfer["handoff"], transfer["outcome"], transfer["state"]) == ("refer", "transferred", "ended"), transfer
    assert record["end_reason"] == "transferred" and started["caller_leg"] == call["id"], record["end_reason"]
    other = await gateway.api("GET", f"/v1/calls/{transfer['human_leg']}")
    assert other["state"] == "ended", other

    # Each phone heard the other's tone after the handoff, when the gateway carried no media any more: a
    # recording's time 0 is its phone's first media, so the handoff is at (its event's t - that media's t).
    def after_handoff(phone: PjsuaPhone, handoff_t: float, hz: float) -> list[float]:
        media_t = next(e.t for e in phone.events if e.name == "media_active")
        at = handoff_t - media_t + 1.0  # a second for the new call's media to start
        return [t for t in heard_at(read_wav(phone.recording), hz) if t >= at]  # type: ignore[arg-type]

    by_human = after_handoff(human, replaced.t, CALLER_HZ)
    by_caller = after_handoff(caller, xfer.t, HUMAN_HZ)
    assert len(by_human) >= 50 and len(by_caller) >= 50, (len(by_human), len(by_caller))  # >= 5 s each way
    assert f"warm transfer {transfer['id']}: handed off" in gateway.process.output
