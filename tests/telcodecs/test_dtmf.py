"""DTMF tones and the streaming Goertzel detector."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from telcodecs import dtmf
from telcodecs.frames import dbfs


def keyed(digits: str, rate: int, *, on_ms: int = 70, off_ms: int = 60, level: float = -20.0) -> np.ndarray:
    gap = np.zeros(rate * off_ms // 1000, dtype=np.int16)
    parts = [gap]
    for d in digits:
        parts += [dtmf.tone(d, duration_ms=on_ms, sample_rate=rate, level_dbfs=level), gap]
    return np.concatenate(parts)


def detect(x: np.ndarray, rate: int, chunk: int) -> list[dtmf.DtmfToneDetected]:
    detector = dtmf.GoertzelDetector(rate)
    events: list[dtmf.DtmfToneDetected] = []
    for start in range(0, x.shape[0], chunk):
        events += detector.feed(x[start : start + chunk])
    return events


def speech_like(rate: int, seconds: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    f0 = 120 + 60 * np.sin(2 * np.pi * 0.7 * t) + 20 * rng.standard_normal() * np.sin(2 * np.pi * 5 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    formants = [(700, 1.0), (1200, 0.6), (2500, 0.3)]
    x = sum(sum(np.sin(k * phase) / (1 + ((k * 140 - fc) / 200) ** 2) * g for k in range(1, 30)) for fc, g in formants)
    envelope = np.abs(np.sin(2 * np.pi * 3 * t)) ** 0.5
    x = x * envelope + 0.05 * rng.standard_normal(t.shape[0])
    return np.rint(x / np.abs(x).max() * 16000).astype(np.int16)


def test_tone_level_and_frequencies() -> None:
    x = dtmf.tone("5", duration_ms=100, sample_rate=8000, level_dbfs=-10)
    assert x.shape == (800,)
    assert abs(dbfs(x[40:-40]) - (-10 + 3.01)) < 0.2  # two tones at -10 dBFS each
    spectrum = np.abs(np.fft.rfft(x * np.hanning(800)))
    peaks = sorted(np.argsort(spectrum)[-2:] * 10)
    assert abs(peaks[0] - 770) <= 10 and abs(peaks[1] - 1336) <= 10
    with pytest.raises(dtmf.DtmfError):
        dtmf.tone("E", duration_ms=50, sample_rate=8000)


@pytest.mark.parametrize("rate", [8000, 16000, 24000, 48000])
def test_all_16_digits_once_each_in_20ms_frames(rate: int) -> None:
    x = keyed(dtmf.DTMF_DIGITS, rate)
    events = detect(x, rate, rate // 50)
    assert "".join(e.digit for e in events) == dtmf.DTMF_DIGITS
    assert all(abs(e.level_dbfs + 20) < 1.5 for e in events)
    starts = [e.sample_index for e in events]
    assert starts == sorted(starts)


def test_chunking_does_not_matter() -> None:
    x = keyed("159#", 8000)
    by_frame = detect(x, 8000, 160)
    by_sample_runs = detect(x, 8000, 7)
    whole = detect(x, 8000, x.shape[0])
    assert by_frame == by_sample_runs == whole


def test_held_key_is_one_event_and_repeated_key_is_two() -> None:
    held = keyed("7", 8000, on_ms=1500)
    assert [e.digit for e in detect(held, 8000, 160)] == ["7"]
    assert [e.digit for e in detect(keyed("77", 8000), 8000, 160)] == ["7", "7"]


def test_digits_in_noise_are_found() -> None:
    rng = np.random.default_rng(2)
    x = keyed("0123456789", 8000, level=-15).astype(float)
    noisy = np.clip(x + rng.normal(0, 200, x.shape[0]), -32768, 32767).astype(np.int16)  # ~20 dB SNR
    assert "".join(e.digit for e in detect(noisy, 8000, 160)) == "0123456789"


def test_weak_twisted_and_short_tones_are_rejected() -> None:
    assert detect(keyed("5", 8000, level=-45), 8000, 160) == []  # below the energy floor
    assert detect(keyed("5", 8000, on_ms=15), 8000, 160) == []  # too short for a key press
    t = np.arange(8000) / 8000
    twisted = (8000 * np.sin(2 * np.pi * 770 * t) + 1000 * np.sin(2 * np.pi * 1336 * t)).astype(np.int16)
    assert detect(twisted, 8000, 160) == []  # column 18 dB below the row: beyond twist limits
    single = (8000 * np.sin(2 * np.pi * 770 * t)).astype(np.int16)
    assert detect(single, 8000, 160) == []


@pytest.mark.parametrize("seed", range(4))
def test_noise_and_speech_do_not_trigger(seed: int) -> None:
    rng = np.random.default_rng(seed)
    noise = np.clip(rng.normal(0, 4000, 8000 * 5), -32768, 32767).astype(np.int16)
    assert detect(noise, 8000, 160) == []
    assert detect(speech_like(8000, 5.0, seed), 8000, 160) == []
    assert detect(speech_like(24000, 3.0, seed + 10), 24000, 480) == []


@settings(max_examples=20, deadline=None)
@given(st.text(alphabet=dtmf.DTMF_DIGITS, min_size=1, max_size=6), st.integers(1, 400))
def test_any_digit_sequence_in_any_chunking(digits: str, chunk: int) -> None:
    assert "".join(e.digit for e in detect(keyed(digits, 8000), 8000, chunk)) == digits
