"""Session lifecycle: entry, ownership of tasks, idempotent close, and the lifecycle failure paths."""

from __future__ import annotations

import asyncio
import json

import pytest

from gateway.providers.base import (
    RESUME_NOTE,
    AgentProfile,
    AudioReceived,
    Capabilities,
    RealtimeModel,
    RealtimeSession,
    ResponseDone,
    ResponseInterrupted,
    ResponseStarted,
    SpeechStarted,
    ToolCallRequested,
    ToolSpec,
)
from gateway.providers.errors import ProviderClosedError, ProviderConnectError
from gateway.session import (
    CallState,
    EventRingClosedError,
    ProfileUpdateError,
    SessionConfig,
    SessionStartError,
    SessionStateError,
    ToolRegistry,
)
from gateway.session.events import (
    BargedIn,
    ErrorOccurred,
    ProfileUpdated,
    ProfileUpdateFailed,
    Resumed,
    SessionEnded,
    ToolCallFinished,
    ToolCallRepeated,
    ToolCallStarted,
    ToolResultDelivered,
)
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


class CountingTool:
    """A tool that counts its runs and can be made to block, raise or be observed."""

    def __init__(self, name: str = "lookup", *, background_ok: bool = False, output: str = '{"answer": 42}') -> None:
        self.spec = ToolSpec(name=name, description="test tool")
        self.background_ok = background_ok
        self.output = output
        self.runs = 0
        self.release = asyncio.Event()
        self.block = False
        self.fail: BaseException | None = None

    async def run(self, invocation: object) -> str:
        self.runs += 1
        if self.block:
            await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return self.output


async def test_fakes_implement_the_provider_protocols() -> None:
    model = FakeModel()
    assert isinstance(model, RealtimeModel)
    assert isinstance(await model.connect(AgentProfile()), RealtimeSession)


async def test_start_then_aclose_owns_and_releases_everything() -> None:
    model = FakeModel()
    session, control = make_session(model)
    await session.start()
    assert session.state is CallState.ACTIVE
    assert call_tasks(), "the session runs its tasks under its call id"
    await session.aclose("caller_hung_up")
    assert session.state is CallState.ENDED
    assert session.end_reason == "caller_hung_up"
    assert model.last.closed
    assert control.hang_ups == [], "a close from the worker does not hang up again"
    assert call_tasks() == []
    kinds = [type(r.event).__name__ for r in session.events.events_since(0)[0]]
    assert kinds[-1] == "SessionEnded"


async def test_async_with_closes_on_exit() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    async with session:
        assert session.state is CallState.ACTIVE
    assert session.state is CallState.ENDED
    assert session.end_reason == "closed"
    assert call_tasks() == []


async def test_tool_resolution_failure_during_entry_releases_everything() -> None:
    model = FakeModel()
    profile = AgentProfile(name="bad", tools=(ToolSpec(name="not_registered"),))
    session, _ = make_session(model, profile=profile)
    with pytest.raises(SessionStartError) as info:
        await session.start()
    assert info.value.reason == "start_failed"
    assert "not_registered" in str(info.value)
    assert model.connect_calls == [], "nothing is connected once resolution failed"
    assert session.state is CallState.ENDED
    assert session.end_reason == "start_failed"
    assert call_tasks() == [], "the sender tasks started before resolution were cancelled and awaited"


async def test_connect_failure_after_listeners_registered_releases_everything() -> None:
    model = FakeModel()
    model.script.append(ProviderConnectError("refused", retryable=False))
    session, _ = make_session(model)

    async def follow() -> list[str]:
        return [type(r.event).__name__ async for r in session.events.follow()]

    follower = asyncio.create_task(follow())
    await asyncio.sleep(0)  # the follower is now waiting on the ring
    with pytest.raises(SessionStartError) as info:
        await session.start()
    assert info.value.reason == "provider_unavailable"
    assert isinstance(info.value.__cause__, ProviderConnectError)
    seen = await asyncio.wait_for(follower, DEADLINE)
    assert seen[-1] == "SessionEnded"
    assert call_tasks() == []


async def test_failure_after_connect_closes_the_provider_session_and_its_listener() -> None:
    model = FakeModel()
    session, _ = make_session(model, profile=AgentProfile(name="greeter", greeting="Hello!"))

    # The greeting is the first send on the new connection: make it fail after connect and listener set-up.
    original = model.connect

    async def connect_then_break(profile, **kwargs):  # type: ignore[no-untyped-def]
        fake = await original(profile, **kwargs)
        fake.fail_next["create_response"] = ProviderClosedError("gone during set-up")
        return fake

    model.connect = connect_then_break  # type: ignore[method-assign]
    with pytest.raises(SessionStartError) as info:
        await session.start()
    assert info.value.reason == "provider_unavailable"
    assert model.last.closed and model.last.aclose_calls >= 1
    assert session.state is CallState.ENDED
    assert call_tasks() == []


async def test_retryable_connect_failure_is_retried_at_start() -> None:
    model = FakeModel()
    model.script.append(ProviderConnectError("busy", retryable=True))
    session, _ = make_session(model, config=fast_config(connect_attempts=2))
    await session.start()
    assert len(model.connect_calls) == 2
    assert session.state is CallState.ACTIVE
    await session.aclose()


async def test_aclose_during_start_cancels_the_connect() -> None:
    model = FakeModel()
    model.gate = asyncio.Event()  # connect never completes on its own
    session, _ = make_session(model)
    starter = asyncio.create_task(session.start())
    await model.wait_connects(1)
    await session.aclose("caller_cancelled")
    with pytest.raises(SessionStartError) as info:
        await asyncio.wait_for(starter, DEADLINE)
    assert info.value.reason == "caller_cancelled"
    assert session.end_reason == "caller_cancelled"
    assert model.sessions == []
    assert call_tasks() == []


async def test_background_tool_that_raises_is_contained() -> None:
    model = FakeModel()
    tool = CountingTool()
    tool.fail = RuntimeError("database is down")
    session, _ = make_session(model, tools=ToolRegistry([tool]))
    await session.start()
    model.last.emit(ToolCallRequested(call_id="t1", name="lookup", arguments="{}"))
    error = await wait_event(session, of_type(ErrorOccurred, where="tool lookup"))
    assert "database is down" in error.message
    sent = await model.last.wait_sent(lambda s: [e for e in s if e[0] == "tool_result"])
    assert json.loads(sent[0][2]) == {"error": "lookup failed: RuntimeError"}
    await model.last.wait_sent(lambda s: [e for e in s if e[0] == "create_response"])
    assert session.state is CallState.ACTIVE
    await session.aclose()
    assert call_tasks() == []


async def test_background_tool_task_cancelled_reports_error_output_and_call_goes_on() -> None:
    model = FakeModel()
    tool = CountingTool()
    tool.block = True
    session, _ = make_session(model, tools=ToolRegistry([tool]))
    await session.start()
    model.last.emit(ToolCallRequested(call_id="t1", name="lookup", arguments="{}"))
    await wait_event(session, of_type(ToolCallStarted, call_id="t1"))
    (task,) = [t for t in call_tasks() if t.get_name().endswith(":tool:lookup:t1")]
    task.cancel()
    finished = await wait_event(session, of_type(ToolCallFinished, call_id="t1"))
    assert not finished.ok
    sent = await model.last.wait_sent(lambda s: [e for e in s if e[0] == "tool_result"])
    assert json.loads(sent[0][2]) == {"error": "lookup was cancelled"}
    assert session.state is CallState.ACTIVE
    await session.aclose()
    assert call_tasks() == []


async def test_cleanup_wakes_every_waiter() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()

    async def follow() -> int:
        return len([record async for record in session.events.follow()])

    followers = [asyncio.create_task(follow()) for _ in range(3)]
    never = asyncio.create_task(session.events.wait_for(lambda e: False, timeout_s=60))
    since = asyncio.create_task(session.events.wait_since(session.events.last_id + 1000, timeout_s=60))
    ended = asyncio.create_task(session.wait_ended())
    await asyncio.sleep(0)  # all of them are now parked on the ring or the ended event
    await session.aclose("bye")
    counts = await asyncio.wait_for(asyncio.gather(*followers), DEADLINE)
    assert all(count >= 3 for count in counts)
    with pytest.raises(EventRingClosedError):
        await asyncio.wait_for(never, DEADLINE)
    assert (await asyncio.wait_for(since, DEADLINE)) == ([], False)
    assert await asyncio.wait_for(ended, DEADLINE) == "bye"


async def test_aclose_is_idempotent_and_safe_from_several_tasks() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()
    closers = [asyncio.create_task(session.aclose(f"reason-{i}")) for i in range(5)]
    await asyncio.wait_for(asyncio.gather(*closers), DEADLINE)
    await session.aclose("late")
    assert session.end_reason == "reason-0"
    ended = [r for r in session.events.events_since(0)[0] if isinstance(r.event, SessionEnded)]
    assert len(ended) == 1
    assert model.last.aclose_calls >= 1
    assert call_tasks() == []
    with pytest.raises(SessionStateError):
        await session.start()


async def test_aclose_from_inside_a_session_task_via_hang_up_tool() -> None:
    model = FakeModel()
    session, control = make_session(model)
    await session.start()
    model.last.emit(ToolCallRequested(call_id="h1", name="hang_up", arguments='{"reason": "done"}'))
    assert await asyncio.wait_for(session.wait_ended(), DEADLINE) == "agent_hang_up"
    await session.aclose()
    assert control.hang_ups == ["agent_hang_up"]
    assert call_tasks() == []


async def test_cancelling_the_aclose_caller_does_not_abort_teardown() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()
    closer = asyncio.create_task(session.aclose("x"))
    await asyncio.sleep(0)
    closer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closer
    assert await asyncio.wait_for(session.wait_ended(), DEADLINE) == "x"
    await session.aclose()
    assert call_tasks() == []


async def test_profile_update_failure_keeps_the_old_working_state() -> None:
    model = FakeModel()
    session, _ = make_session(model, profile=AgentProfile(name="first"))
    await session.start()
    first = model.last
    model.script.append(ProviderConnectError("new agent unavailable", retryable=False))
    with pytest.raises(ProfileUpdateError):
        await session.update_profile(AgentProfile(name="second", instructions="other"))
    await wait_event(session, of_type(ProfileUpdateFailed, name="second"))
    assert session.profile.name == "first"
    assert session.state is CallState.ACTIVE
    session.push_inbound(tone_frame(0))
    await first.wait_sent(lambda s: [e for e in s if e[0] == "audio"])
    assert not first.closed

    with pytest.raises(ProfileUpdateError):  # a tool that cannot be resolved: nothing is even connected
        await session.update_profile(AgentProfile(name="third", tools=(ToolSpec(name="missing"),)))
    assert len(model.connect_calls) == 2 and session.profile.name == "first"
    await session.aclose()
    assert call_tasks() == []


async def test_profile_update_abandoned_when_the_call_changes_state_meanwhile() -> None:
    model = FakeModel()
    session, _ = make_session(model, profile=AgentProfile(name="first"))
    await session.start()
    first = model.last
    update_connected, resume_connected = asyncio.Event(), asyncio.Event()
    model.script.extend([update_connected, resume_connected])
    updater = asyncio.create_task(session.update_profile(AgentProfile(name="second")))
    await model.wait_connects(2)
    first.drop("network")  # the old connection drops while the update connects: RESUMING
    await wait_event(session, is_state(CallState.RESUMING))
    await model.wait_connects(3)
    update_connected.set()  # the update's connection arrives mid-resume: abandoned and closed
    with pytest.raises(ProfileUpdateError):
        await asyncio.wait_for(updater, DEADLINE)
    orphan = model.sessions[1]
    assert orphan.profile.name == "second" and orphan.closed
    resume_connected.set()
    await wait_event(session, of_type(Resumed))
    assert session.profile.name == "first"
    assert model.last.profile.name == "first"
    await session.aclose()
    assert call_tasks() == []


async def test_profile_update_success_switches_connection_with_history() -> None:
    model = FakeModel()
    session, _ = make_session(model, profile=AgentProfile(name="first"))
    await session.start()
    first = model.last
    await session.update_profile(AgentProfile(name="second"))
    updated = await wait_event(session, of_type(ProfileUpdated, name="second"))
    assert updated.epoch == 2
    assert session.profile.name == "second"
    await first.changed.until(lambda: first.closed)
    second = model.last
    assert second.profile.name == "second"
    assert (second.history[-1].role, second.history[-1].text) == ("system", RESUME_NOTE)
    assert second.profile.resume_note == "", "the note is replayed once, by the session"
    session.push_inbound(tone_frame(0))
    await second.wait_sent(lambda s: [e for e in s if e[0] == "audio"])
    await session.aclose()


async def test_tool_output_send_failure_is_retried_without_running_the_tool_again() -> None:
    model = FakeModel()
    tool = CountingTool()
    session, _ = make_session(model, tools=ToolRegistry([tool]))
    await session.start()
    first = model.last
    first.fail_next["tool_result"] = ProviderClosedError("connection reset")
    first.emit(ToolCallRequested(call_id="t1", name="lookup", arguments="{}"))
    await wait_event(session, of_type(Resumed))
    second = model.last
    sent = await second.wait_sent(lambda s: [e for e in s if e[0] == "tool_result"])
    assert sent == [("tool_result", "t1", '{"answer": 42}', "lookup")]
    await second.wait_sent(lambda s: [e for e in s if e[0] == "create_response"])
    history_kinds = [(h.kind, h.call_id) for h in second.history]
    assert ("function_call", "t1") in history_kinds and ("function_call_output", "t1") not in history_kinds
    delivered = await wait_event(session, of_type(ToolResultDelivered, call_id="t1"))
    assert delivered.epoch == 2
    assert tool.runs == 1

    # The provider asks again for the same call id: not run again, the result is re-sent.
    second.emit(ToolCallRequested(call_id="t1", name="lookup", arguments="{}"))
    repeated = await wait_event(session, of_type(ToolCallRepeated, call_id="t1"))
    assert repeated.resent
    await second.wait_sent(lambda s: len([e for e in s if e[0] == "tool_result"]) == 2)
    assert tool.runs == 1
    await session.aclose()


async def test_concurrent_interruptions_cancel_playback_once() -> None:
    model = FakeModel()
    session, _ = make_session(model)
    await session.start()
    fake = model.last
    fake.emit(ResponseStarted(response_id="r1"))
    fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(1000)))
    await drained(session, fake)
    for _ in range(10):
        assert session.pull_outbound() is not None
    # Server VAD, a repeated notice and the provider's own interruption, all in one burst.
    fake.emit(SpeechStarted(item_id="u1"), SpeechStarted(item_id="u1"), ResponseInterrupted())
    await drained(session, fake)
    assert session.pull_outbound() is None
    fake.emit(AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(100)))
    await drained(session, fake)
    assert session.pull_outbound() is None, "later deltas of the interrupted response are dropped"
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "truncate"])
    barge_ins = [r.event for r in session.events.events_since(0)[0] if isinstance(r.event, BargedIn)]
    assert len(barge_ins) == 1 and session.stats().barge_ins == 1
    assert len(fake.of("cancel_response")) == 1
    assert fake.of("truncate") == [("truncate", "i1", 0, 200)]
    await session.aclose()


async def test_max_duration_ends_the_call_after_a_goodbye() -> None:
    clock = FakeClock()
    model = FakeModel()
    config = fast_config(goodbye_message="We are out of time. Goodbye!")
    session, control = make_session(model, clock=clock, config=config, profile=AgentProfile(max_duration_s=60.0))
    await session.start()
    fake = model.last
    clock.advance(59.0)
    assert session.pull_outbound() is None and session.state is CallState.ACTIVE
    clock.advance(1.0)
    session.pull_outbound()
    (request,) = await fake.wait_sent(lambda s: [e for e in s if e[0] == "create_response"])
    assert "We are out of time. Goodbye!" in request[1]
    fake.emit(ResponseStarted(response_id="bye"), AudioReceived(response_id="bye", item_id="b", pcm=pcm_ms(40)))
    fake.emit(ResponseDone(response_id="bye", status="completed"))
    await drained(session, fake)
    assert control.hang_ups == []
    assert session.pull_outbound() is not None and session.pull_outbound() is not None
    session.pull_outbound()  # drained: the goodbye has been heard
    assert await asyncio.wait_for(session.wait_ended(), DEADLINE) == "max_duration"
    await session.aclose()
    assert control.hang_ups == ["max_duration"]
    # The tick contract holds after the end: no exceptions, silence, nothing forwarded.
    session.push_inbound(tone_frame(0))
    session.dtmf_received("1")
    assert session.pull_outbound() is None
    assert call_tasks() == []


async def test_max_duration_without_goodbye_hangs_up_at_once() -> None:
    clock = FakeClock()
    model = FakeModel()
    session, control = make_session(model, clock=clock, profile=AgentProfile(max_duration_s=5.0))
    await session.start()
    clock.advance(5.0)
    session.pull_outbound()
    assert await asyncio.wait_for(session.wait_ended(), DEADLINE) == "max_duration"
    await session.aclose()
    assert control.hang_ups == ["max_duration"]


@pytest.mark.parametrize("quiet_chunks", [True, False])
async def test_a_caller_quiet_for_a_second_goes_in_100_ms_messages_unless_the_agent_answers_each_frame(
    quiet_chunks: bool,
) -> None:
    model = FakeModel(capabilities=Capabilities(server_vad=True, truncate=True, quiet_chunks=quiet_chunks))
    session, _ = make_session(model, config=SessionConfig())  # 100 ms chunks after 1 s quiet: the defaults
    await session.start()
    for i in range(60):
        session.push_inbound(tone_frame(i, level=100))  # line noise, under -36 dBFS
    session.push_inbound(tone_frame(60))  # the caller speaks: what waited goes with it
    sizes = [len(e[1]) // 960 for e in model.last.sent if e[0] == "audio"]
    if quiet_chunks:
        assert sizes == [1] * 49 + [5, 5, 2]  # the 50th quiet frame starts the 100 ms chunks
    else:
        assert sizes == [1] * 61
    assert session.stats().frames_to_provider == 61
    await session.aclose()
