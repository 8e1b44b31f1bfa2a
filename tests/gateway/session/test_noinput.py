"""Caller no-input (gateway/session/noinput.py): the table driven with a virtual clock, then through a session."""

from __future__ import annotations

import asyncio

import pytest

from gateway.providers.base import AgentProfile, SpeechStarted, SpeechStopped, ToolCallRequested
from gateway.session import ToolRegistry
from gateway.session.events import NoInputPrompted, SessionEnded
from gateway.session.noinput import TABLE, NoInputError, NoInputPolicy, NoInputState, NoInputTimer
from tests.gateway.session.fakes import (
    FakeClock,
    FakeModel,
    agent_audio,
    drained,
    fast_config,
    make_session,
    wait_event,
)
from tests.gateway.session.test_tools import SlowTool

TICK = 0.02


def _run(timer: NoInputTimer, clock: list[float], seconds: float, *, waiting: bool = True) -> list[tuple[float, str]]:
    """Tick ``timer`` for ``seconds`` of virtual time; the actions with the time they fell due."""
    actions = []
    for _ in range(round(seconds / TICK)):
        clock[0] = round(clock[0] + TICK, 6)
        action = timer.tick(clock[0], waiting=waiting)
        if action is not None:
            actions.append((clock[0], action))
    return actions


def test_prompt_then_goodbye_after_the_silence_owed() -> None:
    timer, clock = NoInputTimer(NoInputPolicy(prompt_s=5.0, hangup_s=3.0)), [0.0]
    assert _run(timer, clock, 6.0) == [(5.02, "prompt")]  # waiting from the first tick at 0.02
    # The agent speaks its prompt: the clock stops, and restarts from zero when it waits again.
    assert _run(timer, clock, 2.0, waiting=False) == []
    assert timer.next_deadline() is None
    assert _run(timer, clock, 4.0) == [(11.02, "goodbye")]
    assert timer.state is NoInputState.DONE
    assert _run(timer, clock, 10.0) == [], "nothing more once done"


def test_caller_speech_starts_over_and_busy_stretches_do_not_count() -> None:
    timer, clock = NoInputTimer(NoInputPolicy(prompt_s=5.0, hangup_s=3.0)), [0.0]
    assert _run(timer, clock, 4.0) == []
    assert _run(timer, clock, 30.0, waiting=False) == [], "a tool run (or the agent talking) is not silence"
    assert _run(timer, clock, 4.0) == [], "the clock restarted when the agent waited again"
    assert _run(timer, clock, 1.1) != []
    assert timer.state is NoInputState.PROMPTED
    timer.caller_spoke()
    assert timer.state is NoInputState.LISTENING and timer.waiting_since is None
    assert [a for _, a in _run(timer, clock, 5.1)] == ["prompt"], "prompted again, not hung up"


def test_without_a_prompt_or_a_hangup() -> None:
    timer, clock = NoInputTimer(NoInputPolicy(prompt_s=0.0, hangup_s=2.0)), [0.0]
    assert [a for _, a in _run(timer, clock, 2.1)] == ["goodbye"]
    timer, clock = NoInputTimer(NoInputPolicy(prompt_s=1.0, hangup_s=0.0)), [0.0]
    assert [a for _, a in _run(timer, clock, 60.0)] == ["prompt"], "no hang-up configured: it waits"
    assert not NoInputPolicy().enabled
    with pytest.raises(NoInputError):
        NoInputPolicy(prompt_s=-1.0)


def test_table_covers_every_live_state() -> None:
    for state in (NoInputState.LISTENING, NoInputState.PROMPTED):
        for event in ("silence_elapsed", "caller_spoke"):
            assert (state, event) in TABLE
    assert not [key for key in TABLE if key[0] is NoInputState.DONE]


async def test_session_prompts_then_ends_the_call_no_input() -> None:
    model = FakeModel()
    clock = FakeClock()
    profile = AgentProfile(
        name="agent",
        no_input_prompt_s=4.0,
        no_input_hangup_s=3.0,
        no_input_prompt="Hello, are you there?",
        no_input_goodbye="Bye now.",
    )
    session, control = make_session(model, clock=clock, profile=profile, config=fast_config(goodbye_timeout_s=0.5))
    await session.start()
    fake = model.last
    # The caller speaks, the agent answers: neither is silence owed.
    fake.emit(SpeechStarted(item_id="u1"), SpeechStopped(item_id="u1"))
    agent_audio(fake, ms=1000)
    await drained(session, fake)
    ticks = 0
    while session.pull_outbound() is not None:
        clock.advance(TICK)
        ticks += 1
    assert ticks == 50
    prompts = []
    for _ in range(round(7.0 / TICK)):  # reply_wait_s (1.5) after the caller stopped, then 4 s of waiting
        clock.advance(TICK)
        session.pull_outbound()
        prompts = [r.event for r in session.events.events_since(0)[0] if isinstance(r.event, NoInputPrompted)]
        if prompts:
            break
    assert len(prompts) == 1 and prompts[0].silent_s == pytest.approx(4.0, abs=0.05)
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "create_response"])
    assert fake.of("create_response") == [("create_response", "Say exactly this, then stop: Hello, are you there?")]
    agent_audio(fake, response_id="r2", item_id="i2", ms=400)
    await drained(session, fake)
    for _ in range(round(20.0 / TICK)):
        clock.advance(TICK)
        session.pull_outbound()
        await asyncio.sleep(0)  # the goodbye is said by a task of the session's
        if len(fake.of("create_response")) == 2:
            break
    assert fake.of("create_response")[-1] == ("create_response", "Say exactly this, then stop: Bye now.")
    ended = await wait_event(session, lambda e: isinstance(e, SessionEnded))
    assert ended == SessionEnded(reason="no_input")
    assert control.hang_ups == ["no_input"]


async def test_session_timer_waits_for_a_running_tool() -> None:
    model = FakeModel()
    clock = FakeClock()
    slow = SlowTool("look_up")
    profile = AgentProfile(name="agent", no_input_prompt_s=1.0)
    session, _ = make_session(model, clock=clock, profile=profile, tools=ToolRegistry([slow]))
    await session.start()
    fake = model.last
    fake.emit(ToolCallRequested(call_id="t1", name="look_up", arguments="{}"))
    await drained(session, fake)
    await slow.started.wait()
    for _ in range(200):  # 4 s while the tool runs (promoted to the background meanwhile)
        clock.advance(TICK)
        session.pull_outbound()
    assert not [r for r in session.events.events_since(0)[0] if isinstance(r.event, NoInputPrompted)]
    slow.release.set()
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "tool_result"])
    await drained(session, fake)
    for _ in range(round(6.0 / TICK)):  # the response the result asked for may take 3 s, then 1 s of waiting
        clock.advance(TICK)
        session.pull_outbound()
    assert [r for r in session.events.events_since(0)[0] if isinstance(r.event, NoInputPrompted)]
    await session.aclose()
