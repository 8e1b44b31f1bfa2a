"""The audio helpers: WAV round trip, alignment under delay/noise/slips, and espeak speech."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.audio import (
    align_and_correlate,
    chirp_marker,
    read_wav,
    resample,
    rms_dbfs,
    speech_wav,
    tone,
    write_wav,
)
from tests.support.fixtures import require_speech_tools

RATE = 8000


def _voice_like(seconds: float, seed: int) -> np.ndarray:
    """Band-limited noise bursts: speech-like enough to have a single clear correlation peak."""
    rng = np.random.default_rng(seed)
    n = round(seconds * RATE)
    noise = rng.standard_normal(n)
    kernel = np.hanning(9)
    shaped = np.convolve(noise, kernel / kernel.sum(), mode="same")
    bursts = (np.sin(2 * np.pi * 3 * np.arange(n) / RATE) > -0.3).astype(float)
    return np.asarray(np.round(8000 * shaped * bursts), dtype=np.int16)


def test_wav_round_trip_keeps_samples_rate_and_channels(tmp_path: Path) -> None:
    stereo = np.stack([tone(440, 0.1, 48000), tone(660, 0.1, 48000)], axis=1)
    write_wav(tmp_path / "s.wav", stereo, 48000)
    wav = read_wav(tmp_path / "s.wav")
    assert wav.rate == 48000 and wav.channels == 2
    assert np.array_equal(wav.samples, stereo)
    assert math.isclose(wav.duration, 0.1)


@settings(max_examples=25, deadline=None)
@given(delay=st.integers(min_value=0, max_value=RATE), seed=st.integers(0, 1000))
def test_alignment_finds_the_delay_behind_leading_silence_and_noise(delay: int, seed: int) -> None:
    sent = _voice_like(1.0, seed)
    rng = np.random.default_rng(seed + 1)
    received = np.concatenate([np.zeros(delay, dtype=np.int16), sent, np.zeros(400, dtype=np.int16)])
    noisy = np.clip(received + rng.normal(0, 150, received.size), -32768, 32767).astype(np.int16)
    correlation, lag = align_and_correlate(sent, noisy, RATE)
    assert lag == delay
    assert correlation > 0.9


def test_unrelated_audio_does_not_correlate() -> None:
    correlation, _ = align_and_correlate(_voice_like(1.0, 1), _voice_like(1.5, 2), RATE)
    assert correlation < 0.3


def test_a_jitter_buffer_slip_is_tolerated_but_a_missing_half_is_not() -> None:
    sent = _voice_like(2.0, 7)
    # 10 ms dropped in the middle, as a jitter buffer does when it shrinks.
    slipped = np.concatenate([np.zeros(300, dtype=np.int16), sent[:8000], sent[8080:]])
    strict, _ = align_and_correlate(sent, slipped, RATE, max_slip_seconds=0)
    tolerant, _ = align_and_correlate(sent, slipped, RATE)
    assert tolerant > 0.9 > strict
    truncated, _ = align_and_correlate(sent, sent[: sent.size // 2], RATE)
    assert truncated < 0.6


def test_slips_that_add_up_beyond_one_slip_are_followed() -> None:
    sent = _voice_like(4.0, 11)
    # Five 20 ms frames inserted, one every 0.6 s: 100 ms in all, far beyond one window's +-30 ms.
    pieces, gap = [], np.zeros(160, dtype=np.int16)
    for k, start in enumerate(range(0, sent.size, 4800)):
        pieces += [sent[start : start + 4800], gap] if k < 5 else [sent[start : start + 4800]]
    drifted = np.concatenate(pieces)
    correlation, lag = align_and_correlate(sent, drifted, RATE)
    assert correlation > 0.9, correlation
    assert 0 <= lag <= 5 * 160  # somewhere along the drift
    # The same drift with the audio after it replaced by other audio still fails.
    replaced = np.concatenate([drifted[: drifted.size // 2], _voice_like(2.5, 12)])
    assert align_and_correlate(sent, replaced, RATE)[0] < 0.7


def test_chirp_marker_and_levels() -> None:
    marker = chirp_marker(RATE)
    assert marker.size == RATE // 4
    assert -12 < rms_dbfs(marker) < -6  # amplitude 0.5 sine sweep: about -9 dBFS
    assert rms_dbfs(np.zeros(10, dtype=np.int16)) == -math.inf


def test_resampling_keeps_a_tone_in_place() -> None:
    up = resample(tone(1000, 0.5, 8000), 8000, 48000)
    assert up.size == 24000
    spectrum = np.abs(np.fft.rfft(up))
    assert abs(np.argmax(spectrum) * 48000 / up.size - 1000) < 5


@pytest.mark.peer
def test_speech_wav_renders_real_speech_at_the_asked_format(tmp_path: Path) -> None:
    require_speech_tools()
    path = speech_wav("Testing one two three", tmp_path / "t.wav", rate=48000, channels=2)
    wav = read_wav(path)
    assert (wav.rate, wav.channels) == (48000, 2)
    assert 0.8 < wav.duration < 4
    assert rms_dbfs(wav.samples) > -30
    # Cached: a second render is the same audio.
    again = read_wav(speech_wav("Testing one two three", tmp_path / "u.wav", rate=48000, channels=2))
    assert np.array_equal(wav.samples, again.samples)
