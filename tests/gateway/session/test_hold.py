"""Hold (gateway/session/hold.py): playout pauses without counting, the provider is told, playout continues where
the caller left off, and a barge-in after the unhold truncates at what the caller was actually sent."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gateway.providers.base import (
    AgentProfile,
    AudioReceived,
    ResponseDone,
    ResponseStarted,
    SpeechStarted,
    ToolCallRequested,
    ToolSpec,
)
from gateway.session.events import BargedIn, CallHeld, CallResumed
from gateway.session.hold import HOLD_NOTE, RESUME_NOTE, HoldState
from tests.gateway.session.fakes import (
    FakeClock,
    FakeModel,
    drained,
    fast_config,
    make_session,
    pcm_ms,
    tone_frame,
    wait_event,
)


async def test_caller_hold_pauses_playout_and_the_truncate_counts_only_frames_sent() -> None:
    model = FakeModel()
    clock = FakeClock()
    session, _ = make_session(model, clock=clock)
    await session.start()
    fake = model.last
    audio = pcm_ms(3000)
    fake.emit(ResponseStarted(response_id="r1"))
    fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=audio))
    await drained(session, fake)
    before = [session.pull_outbound() for _ in range(25)]
    assert all(frame is not None for frame in before)

    assert session.set_held(True, by="caller")
    assert not session.set_held(True, by="caller"), "a second hold changes nothing"
    held = await wait_event(session, lambda e: isinstance(e, CallHeld))
    assert held == CallHeld(by="caller", queued_ms=2500, cancelled_response="r1")
    # The provider stops generating and is told why; nothing is asked of it.
    await fake.wait_sent(lambda s: ("text", HOLD_NOTE, "system") in s)
    assert fake.of("cancel_response") == [("cancel_response",)]
    assert fake.of("create_response") == []

    # While held: no frame is taken, caller audio does not reach the provider.
    sent_before = len(fake.audio())
    for index in range(200):
        clock.advance(0.02)
        assert session.pull_outbound() is None
        session.push_inbound(tone_frame(index, level=3000))
    # The cancelled response ends; its audio already delivered stays queued (and a late delta is kept too).
    fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(200, seed=2)))
    fake.emit(ResponseDone(response_id="r1", status="cancelled"))
    await drained(session, fake)
    assert len(fake.audio()) == sent_before, "no caller audio went to the provider during the hold"

    assert session.set_held(False, by="caller")
    resumed = await wait_event(session, lambda e: isinstance(e, CallResumed))
    assert isinstance(resumed, CallResumed) and (resumed.by, resumed.queued_ms) == ("caller", 2700)
    assert resumed.held_s == pytest.approx(4.0)
    await fake.wait_sent(lambda s: ("text", RESUME_NOTE, "system") in s)

    # Playout continues with the 26th frame: exactly where the caller left off.
    after = [session.pull_outbound() for _ in range(12)]
    played = b"".join(frame.to_bytes() for frame in before + after if frame is not None)
    assert played == audio[: 37 * 960]

    fake.emit(SpeechStarted(item_id="u1"))
    await drained(session, fake)
    cut = await wait_event(session, lambda e: isinstance(e, BargedIn))
    assert [(i.item_id, i.sent_ms, i.received_ms) for i in cut.items] == [("i1", 740, 3200)]
    assert not cut.cancelled, "the hold cancelled the response already"
    assert fake.of("cancel_response") == [("cancel_response",)]
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "truncate"])
    assert fake.of("truncate") == [("truncate", "i1", 0, 740)]
    await session.aclose()


async def test_gateway_hold_plays_hold_audio_that_is_not_agent_audio() -> None:
    model = FakeModel()
    music = pcm_ms(100, seed=5)  # five frames, looped
    session, _ = make_session(model, config=fast_config(hold_audio=music))
    await session.start()
    fake = model.last
    fake.emit(ResponseStarted(response_id="r1"))
    fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(1000)))
    fake.emit(ResponseDone(response_id="r1", status="completed"))
    await drained(session, fake)
    assert session.pull_outbound() is not None
    assert session.set_held(True, by="gateway")
    assert not session.set_held(False, by="caller"), "a caller cannot take off the gateway's hold"
    heard = [session.pull_outbound() for _ in range(7)]
    assert b"".join(f.to_bytes() for f in heard if f is not None) == music + music[: 2 * 960]
    assert session.held == "gateway"
    assert session.set_held(False, by="gateway")
    rest = [session.pull_outbound() for _ in range(49)]
    assert sum(f is not None for f in rest) == 49 and session.pull_outbound() is None, "all 50 frames, once each"
    await session.aclose()


def test_hold_state_tone_when_no_audio_is_configured() -> None:
    state = HoldState()
    assert state.frame() is None, "not held"
    assert state.hold("gateway", now=0.0, active_response=None) is not None
    frames = [state.frame() for _ in range(100)]
    loud = [f is not None and bool(np.any(f)) for f in frames]
    assert loud == [True] * 20 + [False] * 80
    assert state.resume("caller", now=1.0) is None
    assert state.resume("gateway", now=3.0) == 3.0 and not state.held


async def test_the_agents_hold_tools_are_opt_in_and_hold_through_the_call_control() -> None:
    model = FakeModel()
    session, control = make_session(model)
    await session.start()
    offered = {spec.name for spec in model.last.profile.tools}
    assert "hold_caller" not in offered and "resume_caller" not in offered, "a profile must name them"
    await session.aclose()

    model = FakeModel()
    tools = (ToolSpec(name="hold_caller", description=""), ToolSpec(name="resume_caller", description=""))
    session, control = make_session(model, profile=AgentProfile(name="agent", tools=tools))
    await session.start()
    fake = model.last
    assert {spec.name for spec in fake.profile.tools} == {"hold_caller", "resume_caller"}
    fake.emit(ToolCallRequested(call_id="h1", name="hold_caller", arguments="{}"))
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "tool_result" and e[1] == "h1"])
    fake.emit(ToolCallRequested(call_id="h2", name="resume_caller", arguments="{}"))
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "tool_result" and e[1] == "h2"])
    assert control.holds == [True, False]
    assert [json.loads(e[2]) for e in fake.of("tool_result")] == [
        {"ok": True, "status": "held"},
        {"ok": True, "status": "resumed"},
    ]
    await session.aclose()
