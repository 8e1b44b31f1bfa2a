"""Where a session's greeting words come from (gateway/session/amd_listen.py ``words_source``): a profile's
``amd_stt`` opens the worker's side recogniser whatever the provider (a realtime one included), and wins over a
pipeline's own; a profile without one keeps the provider's, or the timing rules alone; a side recogniser that
fails to open leaves the timing verdict, logged."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
import pytest

from gateway.media.amd import AmdConfig
from gateway.media.amd_words import WordsConfig
from gateway.media.tick import Frame
from gateway.providers.base import AgentProfile, ComponentSpec
from gateway.session.amd_gate import AmdPolicy
from gateway.session.amd_listen import GreetingTranscribing, words_source
from gateway.session.events import AmdDetected, SessionEnded
from gateway.session.session import CallSession
from tests.gateway.media.test_amd import silence, words
from tests.gateway.session.fakes import FakeCallControl, FakeClock, FakeModel, fast_config, wait_event
from tests.gateway.session.test_amd_words_gate import TICK, _ListeningModel, _pcm, _Transcriber

AMD_STT = ComponentSpec(name="scripted")


class _SideRecognisers:
    """The worker's side source of ``amd_stt`` recognisers (GreetingRecognisers in production)."""

    def __init__(self, *, fail: bool = False) -> None:
        self.transcriber = _Transcriber()
        self.fail = fail
        self.asked: list[AgentProfile] = []

    async def greeting_transcriber(self, profile: AgentProfile) -> _Transcriber:
        self.asked.append(profile)
        if self.fail:
            raise OSError("no deepgram today")
        return self.transcriber


def _session(
    model: FakeModel, side: GreetingTranscribing | None, *, amd_stt: ComponentSpec | None = AMD_STT
) -> tuple[CallSession, FakeCallControl, FakeClock]:
    clock, control = FakeClock(), FakeCallControl()
    session = CallSession(
        call_id="c1",
        profile=AgentProfile(name="agent", provider="openai", greeting="Hello", amd_stt=amd_stt),
        model=model,
        control=control,
        config=fast_config(),
        clock=clock,
        amd=AmdPolicy(mode="detect"),
        amd_recognisers=side,
    )
    return session, control, clock


def test_the_source_is_the_side_for_amd_stt_else_the_providers_own() -> None:
    side, plain, pipeline = _SideRecognisers(), FakeModel(), _ListeningModel()
    with_stt = AgentProfile(name="a", amd_stt=AMD_STT)
    without = AgentProfile(name="b")
    assert words_source(plain, with_stt, side, call_id="c") is side
    assert words_source(pipeline, with_stt, side, call_id="c") is side, "amd_stt overrides the pipeline's STT"
    assert words_source(pipeline, without, side, call_id="c") is pipeline
    assert words_source(plain, without, side, call_id="c") is None
    assert words_source(pipeline, with_stt, None, call_id="c") is pipeline, "no side wired: the provider's own"


async def _greet(session: CallSession, clock: FakeClock, side: _SideRecognisers, frames: int) -> None:
    signal = np.concatenate([silence(0.2), words(1, word_s=0.4), silence(3.0)])
    for i, pcm in enumerate(_pcm(signal)[:frames]):
        session.push_inbound(Frame(index=i, pcm=pcm))
        clock.advance(TICK)
    for _ in range(100):  # the recogniser opens on an owned task: a few loop turns
        if side.transcriber.fed == frames:
            break
        await asyncio.sleep(0)


async def test_a_realtime_profile_with_amd_stt_decides_on_the_side_recognisers_words() -> None:
    side, model = _SideRecognisers(), FakeModel(name="openai")
    session, control, clock = _session(model, side)
    await session.start()
    try:
        await _greet(session, clock, side, 40)
        assert side.transcriber.fed == 40, "the callee's greeting went to the side recogniser (backlog included)"
        assert [p.amd_stt for p in side.asked] == [AMD_STT]
        side.transcriber.queue.put_nowait("Please leave a message after the tone")
        ended = await wait_event(session, lambda e: isinstance(e, SessionEnded))
        assert ended == SessionEnded(reason="machine_detected") and control.hang_ups == ["machine_detected"]
        (decision,) = [r.event for r in session.events.events_since(0)[0] if isinstance(r.event, AmdDetected)]
        assert (decision.result, decision.reason) == ("machine", "words_machine")
        await asyncio.wait_for(side.transcriber.closed.wait(), 2)
        assert model.last.of("create_response") == [] and model.last.of("audio") == [], "the agent heard nothing"
    finally:
        await session.aclose()


async def test_amd_stt_wins_over_a_pipelines_own_recogniser() -> None:
    side, model = _SideRecognisers(), _ListeningModel()
    session, _, clock = _session(model, side)
    await session.start()
    try:
        await _greet(session, clock, side, 30)
        assert side.transcriber.fed == 30 and model.transcriber.fed == 0
    finally:
        await session.aclose()


async def _decided_at(session: CallSession, clock: FakeClock) -> float:
    """Feed "Hello?" (0.5 s) then silence until AMD decides; when it did (s of callee audio)."""
    for i, pcm in enumerate(_pcm(np.concatenate([silence(0.3), words(1, word_s=0.5), silence(3.0)]))):
        session.push_inbound(Frame(index=i, pcm=pcm))
        clock.advance(TICK)
        await asyncio.sleep(0)
        if session.amd is not None:
            assert (session.amd.result, session.amd.reason) == ("human", "short_greeting")
            return i * TICK
    raise AssertionError("AMD never decided")


@pytest.mark.parametrize(("amd_stt", "side_fails"), [(None, False), (AMD_STT, True)])
async def test_without_words_the_timing_verdict_stands(
    amd_stt: ComponentSpec | None, side_fails: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """No amd_stt on a realtime profile: no recogniser, no hold. A side recogniser that fails to open: the human
    verdict comes after the hold, unchanged, and the failure is logged."""
    caplog.set_level(logging.WARNING, logger="gateway.session.amd_listen")
    side = _SideRecognisers(fail=side_fails)
    session, _, clock = _session(FakeModel(name="openai"), side, amd_stt=amd_stt)
    await session.start()
    try:
        decided_at = await _decided_at(session, clock)
    finally:
        await session.aclose()
    timing = 0.3 + 0.5 + AmdConfig().after_greeting_silence_s
    if amd_stt is None:
        assert side.asked == [] and decided_at <= timing + 0.1
    else:
        assert len(side.asked) == 1 and decided_at >= timing + WordsConfig().human_hold_s - 0.1
        assert "c1: AMD without words: the greeting recogniser failed: no deepgram today" in caplog.text


async def test_amd_stt_without_a_side_source_is_logged_and_timing_decides(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.session.amd_listen")
    session, _, clock = _session(FakeModel(name="openai"), None)
    await session.start()
    try:
        assert await _decided_at(session, clock) <= 0.3 + 0.5 + AmdConfig().after_greeting_silence_s + 0.1
    finally:
        await session.aclose()
    assert "call c1: amd_stt 'scripted': this worker builds no side recogniser" in caplog.text
