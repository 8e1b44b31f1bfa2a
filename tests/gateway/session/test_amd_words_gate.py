"""The greeting's words in a session's answering-machine detection (amd_gate.py with a words source,
amd_listen.py): the words the provider's side recogniser hears decide or overturn the timing verdict, the hold
is bounded when they never come, and a machine without a beep still gets its message after a bounded wait."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import numpy.typing as npt
import pytest

from gateway.media.amd import AmdConfig, AnsweringMachineDetector
from gateway.media.amd_words import WordsConfig
from gateway.media.tick import Frame
from gateway.providers.base import AgentProfile
from gateway.session.amd_gate import AmdGate, AmdPolicy
from gateway.session.events import AmdDetected, SessionEnded
from gateway.session.session import CallSession
from tests.gateway.media.test_amd import FRAME, silence, tone, words
from tests.gateway.session.fakes import FakeCallControl, FakeClock, FakeModel, fast_config, wait_event

MESSAGE = "Your appointment is tomorrow at nine."
TICK = 0.02


def _pcm(signal: npt.NDArray[np.float64]) -> list[npt.NDArray[np.int16]]:
    pcm = np.clip(np.round(signal), -32768, 32767).astype(np.int16)
    return [pcm[s : s + FRAME] for s in range(0, pcm.size - FRAME + 1, FRAME)]


def _run(gate: AmdGate, signal: npt.NDArray[np.float64], texts: dict[int, str] | None = None) -> list[tuple[int, str]]:
    """Feed ``signal``; ``texts`` maps a frame index to a text the STT hands over after that frame."""
    actions = []
    for i, pcm in enumerate(_pcm(signal)):
        action = gate.feed(pcm)
        if action is None and texts and i in texts:
            action = gate.words(texts[i])
        if action is not None:
            actions.append((i, action))
    return actions


def test_without_words_the_gate_decides_as_before() -> None:
    gate = AmdGate(AmdPolicy(mode="detect"))
    assert gate.combiner is None and gate.words("leave a message") is None
    actions = _run(gate, np.concatenate([silence(0.3), words(1, word_s=0.5), silence(2.0)]))
    assert [a for _, a in actions] == ["greet"]


def test_a_machine_phrase_hangs_up_before_the_timing_rules_decide() -> None:
    gate = AmdGate(AmdPolicy(mode="detect"), words=WordsConfig())
    actions = _run(gate, np.concatenate([silence(0.2), words(2), silence(3.0)]), texts={30: "Please leave a message"})
    assert actions == [(30, "hang_up")]
    assert gate.report is not None and (gate.report.result, gate.report.reason) == ("machine", "words_machine")
    assert gate.end_reason == "machine_detected" and gate.heard == "Please leave a message"


def test_hi_a_pause_then_a_recording_is_not_greeted() -> None:
    gate = AmdGate(AmdPolicy(mode="detect"), words=WordsConfig())
    signal = np.concatenate([silence(0.2), words(1, word_s=0.3), silence(0.9), words(8), silence(2.0)])
    actions = _run(gate, signal, texts={60: "Hi!"})
    assert [a for _, a in actions] == ["hang_up"]
    assert gate.report is not None and (gate.report.result, gate.report.reason) == ("machine", "speech_went_on")


def test_leave_message_waits_for_the_beep_after_the_words_decided() -> None:
    gate = AmdGate(AmdPolicy(mode="detect_and_leave_message", voicemail_message=MESSAGE), words=WordsConfig())
    signal = np.concatenate([silence(0.2), words(2), silence(0.3), tone(1000.0, 0.4), silence(1.0)])
    beep_frame = int((0.2 + 2 * 0.45 + 0.3) / TICK)
    actions = _run(gate, signal, texts={20: "You have reached the voicemail of Sam"})
    assert actions and actions[0][1] == "leave_message"
    beep_end = beep_frame + int(0.4 / TICK)
    assert beep_end <= actions[0][0] <= beep_end + 2, "the message starts once the beep has ended"
    assert gate.report is not None and gate.report.reason == "words_machine"
    assert gate.report.beep_at_s == pytest.approx(beep_frame * TICK, abs=0.04)


def test_no_beep_leaves_the_message_after_a_bounded_wait() -> None:
    """A greeting that never beeps: the message starts when the greeting has been silent for twice
    after_greeting_silence_s, and a greeting that never stops is cut off at beep_wait_s (documented)."""
    config = AmdConfig(beep_wait_s=4.0)
    policy = AmdPolicy(mode="detect_and_leave_message", voicemail_message=MESSAGE)
    gate = AmdGate(policy, detector=AnsweringMachineDetector(config), words=WordsConfig())
    actions = _run(gate, np.concatenate([silence(0.2), words(9), silence(5.0)]))
    greeting_end = 0.2 + 9 * 0.45 - 0.15
    (index, action), *_ = actions
    assert action == "leave_message"
    assert index * TICK == pytest.approx(greeting_end + 2 * config.after_greeting_silence_s, abs=0.2)
    assert gate.report is not None and gate.report.beep_at_s is not None

    endless = AmdGate(policy, detector=AnsweringMachineDetector(config), words=WordsConfig())
    actions = _run(endless, np.concatenate([silence(0.2), words(40)]))
    (index, action), *_ = actions
    decided_at = endless.report.at_s if endless.report is not None else 0.0
    assert action == "leave_message" and index * TICK <= decided_at + config.beep_wait_s + 0.1


class _Transcriber:
    def __init__(self) -> None:
        self.fed = 0
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.closed = asyncio.Event()

    def feed(self, pcm: npt.NDArray[np.int16]) -> None:
        self.fed += 1

    async def texts(self) -> AsyncIterator[str]:
        while True:
            yield await self.queue.get()

    async def aclose(self) -> None:
        self.closed.set()


class _ListeningModel(FakeModel):
    def __init__(self, *, fail: bool = False) -> None:
        super().__init__()
        self.transcriber = _Transcriber()
        self.fail = fail

    async def greeting_transcriber(self, profile: AgentProfile) -> _Transcriber:
        if self.fail:
            raise OSError("no recogniser")
        return self.transcriber


def _session(model: FakeModel, policy: AmdPolicy) -> tuple[CallSession, FakeCallControl, FakeClock]:
    clock, control = FakeClock(), FakeCallControl()
    session = CallSession(
        call_id="c1",
        profile=AgentProfile(name="agent", greeting="Hello"),
        model=model,
        control=control,
        config=fast_config(),
        clock=clock,
        amd=policy,
    )
    return session, control, clock


async def test_the_recognisers_words_reach_the_decision_in_a_session() -> None:
    model = _ListeningModel()
    session, control, clock = _session(model, AmdPolicy(mode="detect"))
    await session.start()
    try:
        await _words_decide(session, control, clock, model)
    finally:
        await session.aclose()


async def _words_decide(
    session: CallSession, control: FakeCallControl, clock: FakeClock, model: _ListeningModel
) -> None:
    frames = _pcm(np.concatenate([silence(0.2), words(1, word_s=0.4), silence(3.0)]))
    for i, pcm in enumerate(frames[:40]):
        session.push_inbound(Frame(index=i, pcm=pcm))
        clock.advance(TICK)
    for _ in range(100):  # the recogniser opens on an owned task: a few loop turns
        if model.transcriber.fed == 40:
            break
        await asyncio.sleep(0)
    assert model.transcriber.fed == 40, "the callee's greeting went to the side recogniser (backlog included)"
    model.transcriber.queue.put_nowait("The person you are calling is not available")
    ended = await wait_event(session, lambda e: isinstance(e, SessionEnded))
    assert ended == SessionEnded(reason="machine_detected") and control.hang_ups == ["machine_detected"]
    (decision,) = [r.event for r in session.events.events_since(0)[0] if isinstance(r.event, AmdDetected)]
    assert (decision.result, decision.reason) == ("machine", "words_machine")
    await asyncio.wait_for(model.transcriber.closed.wait(), 2)
    assert model.last.of("create_response") == [] and model.last.of("audio") == []


async def test_a_recogniser_that_fails_leaves_the_timing_verdict_after_the_hold() -> None:
    model = _ListeningModel(fail=True)
    session, _, clock = _session(model, AmdPolicy(mode="detect"))
    await session.start()
    try:
        await _hold_ends(session, clock, model)
    finally:
        await session.aclose()


async def _hold_ends(session: CallSession, clock: FakeClock, model: _ListeningModel) -> None:
    decided_at = None
    for i, pcm in enumerate(_pcm(np.concatenate([silence(0.3), words(1, word_s=0.5), silence(3.0)]))):
        session.push_inbound(Frame(index=i, pcm=pcm))
        clock.advance(TICK)
        await asyncio.sleep(0)
        if session.amd is not None:
            decided_at = i * TICK
            break
    assert session.amd is not None and (session.amd.result, session.amd.reason) == ("human", "short_greeting")
    assert decided_at is not None and decided_at <= 0.3 + 0.5 + 0.8 + WordsConfig().human_hold_s + 0.1
    await model.last.wait_sent(lambda s: [e for e in s if e[0] == "create_response"])
