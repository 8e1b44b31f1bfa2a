"""The frame contract helpers and the stand-alone concealer (what the Opus decoder conceals with)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from telcodecs import frames, plc
from telcodecs.plc import Concealer


def test_frame_contract() -> None:
    assert (frames.SAMPLE_RATE, frames.FRAME_SAMPLES, frames.FRAME_BYTES) == (24000, 480, 960)
    quiet = frames.silence(index=3)
    assert quiet.is_silent and quiet.level_dbfs == float("-inf") and quiet.index == 3
    t = np.arange(480) / 24000
    full = np.rint(32767 * np.sin(2 * np.pi * 1000 * t)).astype(np.int16)
    frame = frames.Frame.from_bytes(full.tobytes(), index=0)
    assert abs(frame.level_dbfs - (-3.01)) < 0.05  # a full-scale sine is -3 dBFS RMS
    assert frame.to_bytes() == full.tobytes()
    with pytest.raises(frames.FrameError):
        frames.Frame(index=0, pcm=np.zeros(479, dtype=np.int16))
    whole, rest = frames.split_frames(np.zeros(1000, dtype=np.int16), first_index=5)
    assert [f.index for f in whole] == [5, 6] and rest.shape == (40,)


def test_a_frame_may_carry_the_callers_g711_codes() -> None:
    pcm = np.zeros(480, dtype=np.int16)
    carried = frames.Frame(index=0, pcm=pcm, g711=b"\xff" * 160, g711_law="pcmu")
    assert carried.g711 == b"\xff" * 160 and frames.Frame(index=0, pcm=pcm).g711 is None
    for codes, law in ((b"\xff" * 159, "pcmu"), (b"\xff" * 160, None), (b"\xff" * 160, "g722")):
        with pytest.raises(frames.FrameError, match="g711 needs 160 codes"):
            frames.Frame(index=0, pcm=pcm, g711=codes, g711_law=law)  # type: ignore[arg-type]


def test_an_unchecked_frame_is_the_frame_the_checked_constructor_builds() -> None:
    batch = np.arange(2 * 480, dtype=np.int16).reshape(2, 480)  # the tick's rows: int16[480] by construction
    fast = frames.unchecked_frame(7, batch[1], b"\xd5" * 160, "pcma")
    slow = frames.Frame(index=7, pcm=batch[1], g711=b"\xd5" * 160, g711_law="pcma")
    assert type(fast) is frames.Frame
    assert (fast.index, fast.g711, fast.g711_law) == (slow.index, slow.g711, slow.g711_law)
    assert np.array_equal(fast.pcm, slow.pcm) and np.shares_memory(fast.pcm, batch)  # no copy
    assert repr(fast) == repr(slow)
    bare = frames.unchecked_frame(0, batch[0])
    assert bare.g711 is None and bare.g711_law is None and bare.to_bytes() == batch[0].tobytes()
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.index = 8  # type: ignore[misc]
    # The checked constructor still refuses what the unchecked one would take on trust.
    with pytest.raises(frames.FrameError, match="int16"):
        frames.Frame(index=0, pcm=batch[0].astype(np.int32))  # type: ignore[arg-type]


def test_dbfs_is_the_rms_level_against_full_scale() -> None:
    rng = np.random.default_rng(7)
    for scale in (1.0, 300.0, 9000.0):
        pcm = np.clip(rng.normal(0, scale, 480), -32768, 32767).astype(np.int16)
        rms = float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2)))
        assert frames.dbfs(pcm) == pytest.approx(20 * np.log10(rms / 32768), abs=1e-9)
    assert frames.dbfs(np.full(480, -32768, dtype=np.int16)) == 0.0
    assert frames.dbfs(np.zeros(480, dtype=np.int16)) == float("-inf")
    assert frames.dbfs(np.zeros(0, dtype=np.int16)) == float("-inf")


def test_concealer_repeats_the_pitch_period_at_8khz() -> None:
    rate, period = 8000, 64  # 125 Hz voice
    t = np.arange(rate) // 1
    wave = np.rint(8000 * np.sin(2 * np.pi * t / period) + 3000 * np.sin(4 * np.pi * t / period)).astype(np.int16)
    concealer = Concealer(sample_rate=rate)
    for start in range(0, 1600, 160):
        concealer.observe(wave[start : start + 160])
    filled = concealer.conceal(160)
    expected = wave[1600:1760]
    # After the quarter-period glide the repetition is the true continuation of a periodic signal, at full
    # level for the first 10 ms (80 samples), then fading by 20 % per 10 ms.
    assert np.abs(filled[period // 4 : 80].astype(int) - expected[period // 4 : 80]).max() <= 2
    assert np.abs(filled[80:]).max() < np.abs(expected[80:]).max()
    after = concealer.observe(wave[1760:1920])
    assert abs(int(after[0]) - int(filled[-1])) <= 1000


def _pitch_period_lag_by_lag(x: np.ndarray, rate: int) -> int:
    """The search as G.711 Appendix I words it: each lag scored on its own, the first best kept."""
    lo, hi = int(rate * 2.5 / 1000), min(int(rate * 15 / 1000), x.shape[0] // 2)
    tail = x[-hi:]
    best_lag, best_score = 0, -np.inf
    for lag in range(lo, hi + 1):
        past = x[-hi - lag : -lag]
        denom = np.sqrt(float(tail @ tail) * float(past @ past))
        score = float(tail @ past) / denom if denom > 0 else 0.0
        if score > best_score:
            best_lag, best_score = lag, score
    return best_lag


@pytest.mark.parametrize("rate", [8000, 16000, 24000, 48000])
def test_the_pitch_search_scores_every_lag_as_the_lag_by_lag_search_does(rate: int) -> None:
    rng = np.random.default_rng(rate)
    n = rate * 40 // 1000  # the concealer's history
    for trial in range(60):
        t = np.arange(n)
        period = rng.uniform(rate / 400, rate / 67)
        voiced = 8000 * np.sin(2 * np.pi * t / period) + 2500 * np.sin(6 * np.pi * t / period)
        signal = {0: voiced + rng.normal(0, 300, n), 1: rng.normal(0, 3000, n), 2: np.zeros(n)}[trial % 3]
        if trial % 3 == 2:
            signal[rng.integers(n // 2, n)] = 1000.0  # a single click after silence: most lags see no energy
        signal = np.rint(signal)
        found = plc._pitch_period(signal[:, None], rate)
        assert found == _pitch_period_lag_by_lag(signal, rate)
        if trial % 3 == 0:
            assert found % round(period) <= 2 or -found % round(period) <= 2  # the period or a multiple of it
    assert plc._pitch_period(np.zeros((n, 1)), rate) == 0


def test_a_frame_outside_a_loss_is_returned_as_decoded() -> None:
    concealer = Concealer(sample_rate=48000)
    rng = np.random.default_rng(7)
    frames_in = [rng.integers(-20000, 20000, 960).astype(np.int16) for _ in range(3)]
    for pcm in frames_in:
        out = concealer.observe(pcm)
        assert out.dtype == np.int16 and np.array_equal(out, pcm)
    stereo = Concealer(sample_rate=48000, channels=2)
    interleaved = rng.integers(-20000, 20000, 1920).astype(np.int16)
    assert np.array_equal(stereo.observe(interleaved), interleaved.reshape(-1, 2))
    # The history is what was played: a loss now repeats the last frame's own samples at full level.
    filled = concealer.conceal(240)
    assert np.isin(filled[720 // 4 :], frames_in[-1]).all()  # after the glide (a quarter of the longest period)
