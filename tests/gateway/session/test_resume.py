"""Resume and rotation: caller frames held in order and flushed byte-identical, bounded hold, rebuilt context,
rotation only between turns, polite end after failed attempts, never a send on a stale connection."""

from __future__ import annotations

import asyncio

from gateway.providers.base import (
    RESUME_NOTE,
    AgentProfile,
    AudioReceived,
    Capabilities,
    ConnectionExpiring,
    ProviderErrored,
    ResponseDone,
    ResponseStarted,
    ResumeHandleUpdated,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
    TranscriptReceived,
)
from gateway.providers.errors import ProviderConnectError
from gateway.session import CallState
from gateway.session.events import ResumeAttemptFailed, Resumed, ResumeFailed, ResumeStarted
from tests.gateway.session.fakes import (
    DEADLINE,
    FakeClock,
    FakeModel,
    call_tasks,
    drained,
    fast_config,
    is_state,
    make_session,
    of_type,
    pcm_ms,
    tone_frame,
    wait_event,
)


async def _drop_and_wait_resuming(session, fake, **drop) -> None:  # type: ignore[no-untyped-def]
    fake.drop(**drop)
    await wait_event(session, is_state(CallState.RESUMING))


async def test_resume_holds_frames_and_flushes_them_in_order_byte_identical() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()
    first = model.last
    first.emit(
        TranscriptReceived(role="user", item_id="u1", text="What time do you open?", final=True),
        TranscriptReceived(role="assistant", item_id="a1", text="We open at nine.", final=True),
        ToolCallRequested(call_id="t1", name="send_dtmf", arguments='{"digits": "12"}'),
    )
    await first.wait_sent(lambda s: [e for e in s if e[0] == "tool_result"])
    live = [tone_frame(i) for i in range(5)]
    for frame in live:
        session.push_inbound(frame)
    await first.wait_sent(lambda s: len(b"".join(e[1] for e in s if e[0] == "audio")) == 5 * 960)

    gate = asyncio.Event()
    model.script.append(gate)
    await _drop_and_wait_resuming(session, first, reason="network")
    held = [tone_frame(i) for i in range(5, 45)]
    for frame in held:
        session.push_inbound(frame)
        assert session.pull_outbound() is None, "the caller hears silence while resuming"
    gate.set()
    resumed = await wait_event(session, of_type(Resumed))
    assert resumed.cause == "dropped" and resumed.epoch == 2 and resumed.held_frames == 40
    second = model.last
    expected = b"".join(frame.to_bytes() for frame in held)
    await second.wait_sent(lambda s: len(b"".join(e[1] for e in s if e[0] == "audio")) >= len(expected))
    assert second.audio() == expected
    assert len(second.of("audio")) < 40, "a backlog is sent in batches"
    assert first.audio() == b"".join(frame.to_bytes() for frame in live)
    assert first.sends_after_drop == 0
    assert first.closed

    history = second.history
    assert [(h.kind, h.role, h.text) for h in history[:2]] == [
        ("message", "user", "What time do you open?"),
        ("message", "assistant", "We open at nine."),
    ]
    assert (history[2].kind, history[2].call_id, history[2].name) == ("function_call", "t1", "send_dtmf")
    assert (history[3].kind, history[3].call_id) == ("function_call_output", "t1")
    assert (history[-1].role, history[-1].text) == ("system", RESUME_NOTE)
    assert second.profile.resume_note == "" and first.profile.resume_note == ""
    stats = session.stats()
    assert stats.frames_held == 40 and stats.frames_dropped == 0 and stats.resumes == 1 and stats.epoch == 2

    session.push_inbound(tone_frame(45))
    await second.wait_sent(lambda s: b"".join(e[1] for e in s if e[0] == "audio").endswith(tone_frame(45).to_bytes()))
    await session.aclose()
    assert call_tasks() == []


async def test_hold_overflow_drops_the_oldest_and_counts_them() -> None:
    model = FakeModel()
    session, _ = make_session(model, config=fast_config(hold_buffer_s=0.2))  # 10 frames
    await session.start()
    gate = asyncio.Event()
    model.script.append(gate)
    await _drop_and_wait_resuming(session, model.last)
    frames = [tone_frame(i) for i in range(25)]
    for frame in frames:
        session.push_inbound(frame)
    gate.set()
    await wait_event(session, of_type(Resumed))
    second = model.last
    expected = b"".join(frame.to_bytes() for frame in frames[-10:])
    await second.wait_sent(lambda s: len(b"".join(e[1] for e in s if e[0] == "audio")) >= len(expected))
    assert second.audio() == expected
    assert session.stats().frames_dropped == 15
    await session.aclose()


async def test_frames_before_the_provider_is_ready_are_held_and_flushed() -> None:
    model = FakeModel()
    gate = asyncio.Event()
    model.script.append(gate)
    session, _ = make_session(model)
    starter = asyncio.create_task(session.start())
    await model.wait_connects(1)
    frames = [tone_frame(i) for i in range(3)]
    for frame in frames:
        session.push_inbound(frame)
    gate.set()
    await asyncio.wait_for(starter, DEADLINE)
    await model.last.wait_sent(lambda s: [e for e in s if e[0] == "audio"])
    assert model.last.audio() == b"".join(frame.to_bytes() for frame in frames)
    await session.aclose()


async def test_failed_resume_ends_politely_and_never_sends_on_the_stale_connection() -> None:
    apology = pcm_ms(60)
    model = FakeModel()
    config = fast_config(resume_attempts=3, apology_audio=apology, comfort_tone=True)
    session, control = make_session(model, config=config)
    await session.start()
    first = model.last
    model.script.extend(ProviderConnectError("still down", retryable=True) for _ in range(3))
    await _drop_and_wait_resuming(session, first)
    for index in range(20):
        session.push_inbound(tone_frame(index))
    failed = await wait_event(session, of_type(ResumeFailed))
    assert failed.fatal and failed.attempts == 3
    attempts = [r.event for r in session.events.events_since(0)[0] if isinstance(r.event, ResumeAttemptFailed)]
    assert [a.attempt for a in attempts] == [1, 2, 3]
    # The apology is queued as soon as the resume gave up: the next three ticks play it.
    played = b"".join(session.pull_outbound().to_bytes() for _ in range(3))  # type: ignore[union-attr]
    assert played == apology
    session.pull_outbound()  # drained: the hang-up follows
    assert await asyncio.wait_for(session.wait_ended(), DEADLINE) == "provider_unavailable"
    await session.aclose()
    assert control.hang_ups == ["provider_unavailable"]
    assert len(model.connect_calls) == 4
    assert first.sends_after_drop == 0 and first.audio() == b""
    assert session.stats().resume_failures == 1
    assert call_tasks() == []


async def test_comfort_tone_while_resuming() -> None:
    model = FakeModel()
    session, _ = make_session(model, config=fast_config(comfort_tone=True))
    await session.start()
    gate = asyncio.Event()
    model.script.append(gate)
    await _drop_and_wait_resuming(session, model.last)
    frames = [session.pull_outbound() for _ in range(100)]
    tones = [f for f in frames if f is not None]
    assert 1 <= len(tones) <= 20 and all(-40 < f.level_dbfs < -30 for f in tones)
    gate.set()
    await wait_event(session, of_type(Resumed))
    await session.aclose()


async def test_non_retryable_drop_ends_the_call() -> None:
    model = FakeModel()
    session, control = make_session(model)
    await session.start()
    model.last.drop("auth revoked", retryable=False)
    assert await asyncio.wait_for(session.wait_ended(), DEADLINE) == "provider_unavailable"
    await session.aclose()
    assert control.hang_ups == ["provider_unavailable"]
    assert len(model.connect_calls) == 1


async def test_fatal_provider_error_resumes_and_benign_notice_does_not() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()
    first = model.last
    first.emit(ProviderErrored(code="server_error", message="transient", fatal=False))
    await drained(session, first)
    assert session.state is CallState.ACTIVE and len(model.connect_calls) == 1
    first.emit(ProviderErrored(code="internal", message="socket broke", fatal=True))
    started = await wait_event(session, of_type(ResumeStarted))
    assert started.cause == "errored"
    await wait_event(session, of_type(Resumed))
    await first.changed.until(lambda: first.closed)
    await session.aclose()


async def test_resume_uses_the_last_resumable_handle() -> None:
    model = FakeModel(capabilities=Capabilities(server_vad=True, truncate=False, resume_handle=True))
    session, _ = make_session(model)
    await session.start()
    first = model.last
    first.emit(ResumeHandleUpdated(handle="h-1", resumable=True), ResumeHandleUpdated(handle="h-2", resumable=True))
    await drained(session, first)
    first.drop("goAway")
    resumed = await wait_event(session, of_type(Resumed))
    assert resumed.used_handle
    assert model.connect_calls[-1][2] == "h-2"
    await session.aclose()


async def test_not_resumable_handle_is_not_used() -> None:
    model = FakeModel(capabilities=Capabilities(server_vad=True, truncate=False, resume_handle=True))
    session, _ = make_session(model)
    await session.start()
    first = model.last
    first.emit(ResumeHandleUpdated(handle="h-1", resumable=False))
    await drained(session, first)
    first.drop("goAway")
    await wait_event(session, of_type(Resumed))
    assert model.connect_calls[-1][2] is None
    await session.aclose()


async def test_rotation_waits_for_a_gap_between_turns() -> None:
    clock = FakeClock()
    model = FakeModel(capabilities=Capabilities(server_vad=True, truncate=True, max_connection_s=100.0))
    config = fast_config(rotation_margin_s=10.0, rotation_gap_wait_s=30.0)
    session, _ = make_session(model, clock=clock, config=config)
    await session.start()
    first = model.last
    clock.advance(85.0)
    session.pull_outbound()
    assert session.state is CallState.ACTIVE, "not due yet"

    first.emit(ResponseStarted(response_id="r1"), AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(200)))
    await drained(session, first)
    clock.advance(6.0)  # due (90 s), but the agent is talking
    for _ in range(10):
        assert session.pull_outbound() is not None
    assert session.state is CallState.ACTIVE and len(model.connect_calls) == 1
    first.emit(ResponseDone(response_id="r1", status="completed"), SpeechStarted(item_id="u1"))
    await drained(session, first)
    session.pull_outbound()
    assert session.state is CallState.ACTIVE, "the caller is speaking"
    first.emit(SpeechStopped(item_id="u1"))
    await drained(session, first)
    session.pull_outbound()  # a gap: rotate now
    assert session.state is CallState.RESUMING
    resumed = await wait_event(session, of_type(Resumed))
    assert resumed.cause == "rotation"
    assert session.stats().rotations == 1 and session.stats().resumes == 0
    await first.changed.until(lambda: first.closed)
    assert first.sends_after_drop == 0
    await session.aclose()


async def test_rotation_is_forced_at_its_deadline_without_a_gap() -> None:
    clock = FakeClock()
    model = FakeModel(capabilities=Capabilities(server_vad=True, truncate=True, max_connection_s=100.0))
    config = fast_config(rotation_margin_s=10.0, rotation_gap_wait_s=5.0)
    session, _ = make_session(model, clock=clock, config=config)
    await session.start()
    first = model.last
    first.emit(SpeechStarted(item_id="u1"))  # the caller never stops talking
    await drained(session, first)
    clock.advance(91.0)
    session.pull_outbound()
    assert session.state is CallState.ACTIVE
    clock.advance(4.5)  # 95.5 >= 90 + 5
    session.pull_outbound()
    assert session.state is CallState.RESUMING
    await wait_event(session, of_type(Resumed, cause="rotation"))
    await session.aclose()


async def test_connection_expiring_rotates_at_the_next_gap() -> None:
    clock = FakeClock()
    model = FakeModel()
    session, _ = make_session(model, clock=clock)
    await session.start()
    first = model.last
    first.emit(ResponseStarted(response_id="r1"), ConnectionExpiring(time_left_s=50.0))
    await drained(session, first)
    session.pull_outbound()
    assert session.state is CallState.ACTIVE, "a response is running"
    first.emit(ResponseDone(response_id="r1", status="completed"))
    await drained(session, first)
    session.pull_outbound()
    await wait_event(session, of_type(Resumed, cause="expiring"))
    await session.aclose()


async def test_failed_rotation_stays_on_the_working_connection() -> None:
    clock = FakeClock()
    model = FakeModel(capabilities=Capabilities(server_vad=True, truncate=True, max_connection_s=100.0))
    config = fast_config(rotation_margin_s=10.0, resume_attempts=2)
    session, control = make_session(model, clock=clock, config=config)
    await session.start()
    first = model.last
    model.script.extend([ProviderConnectError("no", retryable=True), ProviderConnectError("no", retryable=True)])
    clock.advance(95.0)
    session.pull_outbound()
    failed = await wait_event(session, of_type(ResumeFailed))
    assert not failed.fatal
    await wait_event(session, lambda e: is_state(CallState.ACTIVE)(e) and "rotation failed" in e.reason)
    session.push_inbound(tone_frame(0))
    await first.wait_sent(lambda s: [e for e in s if e[0] == "audio"])
    assert control.hang_ups == []
    await session.aclose()


async def test_configured_resume_instruction_replaces_the_profile_note() -> None:
    model = FakeModel()
    config = fast_config(resume_instruction="Carry on; no greeting.")
    session, _ = make_session(model, config=config, profile=AgentProfile(resume_note="profile note"))
    await session.start()
    model.last.drop()
    await wait_event(session, of_type(Resumed))
    notes = [h.text for h in model.last.history if h.role == "system"]
    assert notes == ["Carry on; no greeting."]
    await session.aclose()
