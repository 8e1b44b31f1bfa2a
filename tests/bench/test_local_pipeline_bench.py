"""`gateway bench local-pipeline`: each turn is heard, answered and timed; the scoring is the tests' scoring."""

from __future__ import annotations

import numpy as np
import pytest

from bench.local_pipeline import SENTENCES, _caller_audio, _last_speech_frame, normalise, run_call, word_errors
from gateway.providers.pipeline.local.espeak import EspeakConfig, EspeakTts
from gateway.providers.pipeline.local.whisper import WhisperConfig, shared_whisper
from tests.gateway.providers.pipeline.local.conftest import require_local_extra
from tests.gateway.providers.pipeline.local.speech import SENTENCES as FIXTURES
from tests.gateway.providers.pipeline.local.speech import word_errors as fixture_word_errors
from tests.support.peers import require_binary


def test_the_bench_scores_the_projects_fixtures_as_the_tests_do() -> None:
    assert SENTENCES == FIXTURES
    assert normalise("My order number is 4572.") == ["my", "order", "number", "is", "four", "five", "seven", "two"]
    pairs = [("Good bye, thank you.", "goodbye thank you"), (SENTENCES[3], "Can you transfer meet up human agent?")]
    assert [word_errors(a, b) for a, b in pairs] == [fixture_word_errors(a, b) for a, b in pairs] == [0, 4]


def test_the_end_of_speech_is_the_last_frame_above_the_floor() -> None:
    loud = (np.full(480, 3000, dtype="<i2")).tobytes()
    quiet = bytes(960)
    assert _last_speech_frame([quiet, loud, loud, quiet, quiet]) == 2


@pytest.mark.peer
@pytest.mark.timeout(120)
async def test_a_short_call_times_every_turn() -> None:
    require_local_extra()
    require_binary("espeak-ng")
    runtime = await shared_whisper(WhisperConfig())
    caller, agent = EspeakTts(EspeakConfig(wpm=150)), EspeakTts()
    try:
        speech = (await _caller_audio(caller))[:2]
        result = await run_call(0, speech, runtime, agent, endpoint_ms=500, talk=0.6)
    finally:
        await caller.aclose()
        await agent.aclose()
    assert [t.sentence for t in result.turns] == list(SENTENCES[:2])
    for turn in result.turns:
        assert word_errors(turn.sentence, turn.heard) <= 2, turn
        assert turn.latency_s is not None and 0.5 <= turn.latency_s < 10.0  # at least the endpoint's silence
        assert turn.decode_s is not None and turn.decode_s >= 0.0
