"""Outbound answering-machine detection in a session (gateway/session/amd_gate.py): the greeting and the callee's
audio wait for the decision; a human is greeted, a machine or a fax is hung up on, and a voicemail is left after
the beep."""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt
import pytest

from gateway.media.tick import Frame
from gateway.providers.base import AgentProfile
from gateway.session.amd_gate import AmdGate, AmdPolicy, AmdPolicyError
from gateway.session.events import AmdDetected, NoInputPrompted, SessionEnded, VoicemailBeepHeard
from gateway.session.session import CallSession
from tests.gateway.media.test_amd import FRAME, babble, silence, tone, words
from tests.gateway.session.fakes import (
    FakeCallControl,
    FakeClock,
    FakeModel,
    agent_audio,
    drained,
    fast_config,
    wait_event,
)

GREETING = "Hello, this is Ada from the clinic."
MESSAGE = "Your appointment is tomorrow at nine."
TICK = 0.02


def _frames(signal: npt.NDArray[np.float64]) -> list[Frame]:
    pcm = np.clip(np.round(signal), -32768, 32767).astype(np.int16)
    return [Frame(index=i, pcm=pcm[s : s + FRAME]) for i, s in enumerate(range(0, pcm.size - FRAME + 1, FRAME))]


def _session(
    policy: AmdPolicy, clock: FakeClock, *, no_input_prompt_s: float = 0.0
) -> tuple[CallSession, FakeCallControl, FakeModel]:
    model, control = FakeModel(), FakeCallControl()
    session = CallSession(
        call_id="c1",
        profile=AgentProfile(name="agent", greeting=GREETING, no_input_prompt_s=no_input_prompt_s),
        model=model,
        control=control,
        config=fast_config(),
        clock=clock,
        amd=policy,
    )
    return session, control, model


def _amd_events(session: CallSession) -> list[AmdDetected]:
    return [r.event for r in session.events.events_since(0)[0] if isinstance(r.event, AmdDetected)]


HUMAN = np.concatenate([silence(0.3), words(1, word_s=0.5), silence(2.0), babble(1.0, seed=9)])
MACHINE = np.concatenate([silence(0.2), words(9), silence(0.3), tone(1000.0, 0.4), silence(1.0)])


def test_leave_message_needs_a_message() -> None:
    with pytest.raises(AmdPolicyError):
        AmdPolicy(mode="detect_and_leave_message", voicemail_message="  ")
    gate = AmdGate(AmdPolicy(mode="detect"))
    assert gate.open and gate.report is None


async def test_greeting_and_audio_wait_for_a_human() -> None:
    clock = FakeClock()
    session, _, model = _session(AmdPolicy(mode="detect"), clock)
    await session.start()
    fake = model.last
    assert fake.of("create_response") == [], "no greeting before the decision"
    forwarded_at_decision = None
    for frame in _frames(HUMAN):
        session.push_inbound(frame)
        clock.advance(TICK)
        if forwarded_at_decision is None and _amd_events(session):
            forwarded_at_decision = session.stats().frames_in
            await drained(session, fake)
            assert fake.of("audio") == [], "nothing of the callee reached the provider before the decision"
    (decision,) = _amd_events(session)
    assert (decision.result, decision.reason) == ("human", "short_greeting")
    assert session.amd is not None and session.amd.result == "human"
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "create_response"])
    assert fake.of("create_response") == [("create_response", f"Greet the caller now, saying: {GREETING}")]
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "audio"])
    assert fake.of("audio"), "the callee's audio flows once a human is heard"
    await session.aclose()


@pytest.mark.parametrize(
    ("signal", "reason"),
    [(MACHINE, "machine_detected"), (np.concatenate([tone(1100.0, 0.6), silence(3.0)]), "fax_detected")],
)
async def test_machine_or_fax_is_hung_up_on(signal: npt.NDArray[np.float64], reason: str) -> None:
    clock = FakeClock()
    session, control, model = _session(AmdPolicy(mode="detect"), clock)
    await session.start()
    for frame in _frames(signal):
        session.push_inbound(frame)
        clock.advance(TICK)
        if _amd_events(session):
            break
    assert await wait_event(session, lambda e: isinstance(e, SessionEnded)) == SessionEnded(reason=reason)
    assert control.hang_ups == [reason]
    assert model.last.of("create_response") == [] and model.last.of("audio") == []


async def test_voicemail_is_left_after_the_beep() -> None:
    clock = FakeClock()
    policy = AmdPolicy(mode="detect_and_leave_message", voicemail_message=MESSAGE)
    session, control, model = _session(policy, clock)
    await session.start()
    fake = model.last
    beep_frame = None
    for frame in _frames(MACHINE):
        session.push_inbound(frame)
        clock.advance(TICK)
        if [r for r in session.events.events_since(0)[0] if isinstance(r.event, VoicemailBeepHeard)]:
            beep_frame = frame.index
            break
    (decision,) = _amd_events(session)
    assert decision.result == "machine" and beep_frame is not None
    # Told when the 0.4 s beep has ended (a message over its tail would be lost); beep_at_s is where it began.
    assert session.amd is not None and session.amd.beep_at_s == pytest.approx(beep_frame * TICK - 0.4, abs=0.06)
    await fake.wait_sent(lambda s: [e for e in s if e[0] == "create_response"])
    assert fake.of("create_response") == [("create_response", f"Say exactly this, then stop: {MESSAGE}")]
    assert fake.of("audio") == [], "the machine's greeting never reached the provider"
    agent_audio(fake, ms=600)
    await drained(session, fake)
    played = 0
    while session.pull_outbound() is not None:
        clock.advance(TICK)
        played += 1
        await asyncio.sleep(0)
    assert played == 30, "the whole message was played before the hang-up"
    assert await wait_event(session, lambda e: isinstance(e, SessionEnded)) == SessionEnded(reason="voicemail_left")
    assert control.hang_ups == ["voicemail_left"]


async def test_no_input_waits_while_amd_listens() -> None:
    clock = FakeClock()
    policy = AmdPolicy(mode="detect_and_leave_message", voicemail_message=MESSAGE)
    session, _, _ = _session(policy, clock, no_input_prompt_s=0.5)
    await session.start()
    for frame in _frames(np.concatenate([silence(0.2), words(9)])):  # a long greeting, no beep yet
        session.push_inbound(frame)
        session.pull_outbound()
        clock.advance(TICK)
    assert [e.result for e in _amd_events(session)] == ["machine"]
    assert not [r for r in session.events.events_since(0)[0] if isinstance(r.event, NoInputPrompted)]
    await session.aclose()
