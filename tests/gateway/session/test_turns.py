"""Turns' latency reports: the caller-to-reply round trip and how long provider audio waited to be played."""

from __future__ import annotations

import pytest

from gateway.providers.base import AudioDone, AudioReceived
from gateway.session import SessionConfig
from gateway.session.turns import Turns
from tests.gateway.session.fakes import FakeClock, pcm_ms


def _turns(clock: FakeClock) -> tuple[Turns, list[tuple[str, float]]]:
    seen: list[tuple[str, float]] = []
    turns = Turns(SessionConfig(), server_vad=True, clock=clock, on_latency=lambda kind, s: seen.append((kind, s)))
    return turns, seen


def test_the_first_frame_of_each_item_reports_its_wait_and_the_first_of_a_reply_the_round_trip() -> None:
    clock = FakeClock()
    turns, seen = _turns(clock)
    turns.caller_stopped()
    clock.advance(0.400)
    turns.audio(AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(100)))
    clock.advance(0.030)
    turns.audio(AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(100)))  # a later delta: not a new wait
    clock.advance(0.015)
    audio, _ = turns.next_frame(clock(), index=0, resuming=False)
    assert audio is not None
    assert [kind for kind, _ in seen] == ["round_trip", "agent_audio_wait"]
    assert seen[0][1] == pytest.approx(0.445) and seen[1][1] == pytest.approx(0.045)
    for index in range(1, 10):  # the rest of the item: nothing new to report
        clock.advance(0.020)
        turns.next_frame(clock(), index=index, resuming=False)
    assert len(seen) == 2
    turns.audio(AudioReceived(response_id="r1", item_id="i2", pcm=pcm_ms(40)))  # a second item, same reply
    clock.advance(0.020)
    turns.next_frame(clock(), index=10, resuming=False)
    assert seen[2:] == [("agent_audio_wait", pytest.approx(0.020))]


def test_prompts_are_not_provider_audio() -> None:
    clock = FakeClock()
    turns, seen = _turns(clock)
    turns.caller_stopped()
    turns.playout.add_prompt(pcm_ms(40))
    clock.advance(0.1)
    assert turns.next_frame(clock(), index=0, resuming=False)[0] is not None
    assert seen == []


def test_a_gap_is_counted_when_playout_runs_dry_inside_an_item_still_arriving() -> None:
    clock = FakeClock()
    turns, _ = _turns(clock)

    def play(frames: int) -> list[bool]:
        out = []
        for _ in range(frames):
            clock.advance(0.020)
            out.append(turns.next_frame(clock(), index=0, resuming=False)[0] is not None)
        return out

    turns.audio(AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(40)))
    assert play(4) == [True, True, False, False]  # the provider fell behind real time: one gap, not two
    assert turns.audio_gaps == 1
    turns.audio(AudioReceived(response_id="r1", item_id="i1", pcm=pcm_ms(40)))
    turns.audio_done(AudioDone(response_id="r1", item_id="i1"))
    assert play(4) == [True, True, False, False]  # the item ended: playout ran dry where it should
    assert turns.audio_gaps == 1
    turns.response_started("r2")
    turns.audio(AudioReceived(response_id="r2", item_id="i2", pcm=pcm_ms(60)))
    assert play(1) == [True]
    assert turns.interrupt() is not None
    assert play(2) == [False, False]  # the caller cut it off: silence the caller asked for, not a gap
    assert turns.audio_gaps == 1
