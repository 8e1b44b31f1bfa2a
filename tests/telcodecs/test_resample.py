"""Resampler quality (passband, images, aliases, delay) and streaming/batching equivalence."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.signal
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from telcodecs import resample
from telcodecs.resample import BatchResampler, ResampleError, StreamResampler

PAIRS = [(8000, 24000), (24000, 8000), (16000, 24000), (24000, 16000), (48000, 24000), (24000, 48000)]
FRAME = {8000: 160, 16000: 320, 24000: 480, 48000: 960}
PASSBAND = {8000: 3400.0, 16000: 7000.0, 48000: 10000.0}


def low_side(pair: tuple[int, int]) -> tuple[int, float]:
    """The lower rate of the pair and the passband edge the issue sets for it."""
    in_rate, out_rate = pair
    other = in_rate if out_rate == 24000 else out_rate
    low = min(in_rate, out_rate)
    return low, PASSBAND[other]


def stream(pair: tuple[int, int], x: np.ndarray) -> np.ndarray:
    r = StreamResampler(*pair)
    frames = x.reshape(-1, r.in_frame)
    return np.concatenate([r.process(f) for f in frames])


def whole(pair: tuple[int, int], x: np.ndarray, taps: np.ndarray) -> np.ndarray:
    d = resample.design(*pair)
    y = scipy.signal.upfirdn(taps, x.astype(np.float64), d.up, d.down)
    n = x.shape[0] * pair[1] // pair[0]
    return np.clip(np.rint(y[:n]), -32768, 32767).astype(np.int16)


def tone(rate: int, freq: float, seconds: float, amplitude: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return np.rint(amplitude * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def amplitude_at(y: np.ndarray, rate: int, freq: float) -> float:
    """Amplitude of the sinusoid at ``freq`` in ``y`` by least squares (y long, freq not at DC)."""
    t = np.arange(y.shape[0]) / rate
    basis = np.stack([np.sin(2 * np.pi * freq * t), np.cos(2 * np.pi * freq * t)], axis=1)
    coef, *_ = np.linalg.lstsq(basis, y.astype(np.float64), rcond=None)
    return float(np.hypot(*coef))


@pytest.mark.parametrize("pair", PAIRS)
def test_frame_sizes_and_delay(pair: tuple[int, int]) -> None:
    r = StreamResampler(*pair)
    assert (r.in_frame, r.out_frame) == (FRAME[pair[0]], FRAME[pair[1]])
    out = r.process(np.zeros(r.in_frame, dtype=np.int16))
    assert out.shape == (FRAME[pair[1]],) and out.dtype == np.int16
    assert 0 < r.delay_ms <= 5.0
    # An impulse comes out delay_ms later (no pre-roll beyond the filter's own delay).
    r.reset()
    x = np.zeros(r.in_frame * 4, dtype=np.int16)
    x[r.in_frame] = 20000
    y = np.concatenate([r.process(f) for f in x.reshape(4, -1)])
    peak_ms = (np.argmax(np.abs(y)) / pair[1] - r.in_frame / pair[0]) * 1000
    assert abs(peak_ms - r.delay_ms) <= 1000 / min(pair) + 1e-9


@pytest.mark.parametrize("pair", PAIRS)
def test_streamed_equals_whole_signal(pair: tuple[int, int]) -> None:
    rng = np.random.default_rng(3)
    d = resample.design(*pair)
    x = np.clip(rng.normal(0, 9000, d.in_frame * 25), -32768, 32767).astype(np.int16)
    x[:100] = 32767  # full-scale steps exercise clipping too
    y = stream(pair, x)
    assert np.array_equal(y, whole(pair, x, d.taps_int / 2.0**24))  # the applied (quantized) taps: exact
    assert np.abs(y.astype(int) - whole(pair, x, d.taps).astype(int)).max() <= 1  # the designed taps


@pytest.mark.parametrize("pair", PAIRS)
def test_frequency_response_meets_the_spec(pair: tuple[int, int]) -> None:
    d = resample.design(*pair)
    low, passband = low_side(pair)
    rate = d.in_rate * d.up
    freqs, response = scipy.signal.freqz(d.taps_int / 2.0**24 / d.up, worN=1 << 15, fs=rate)
    db = 20 * np.log10(np.maximum(np.abs(response), 1e-12))
    inband = db[freqs <= passband]
    assert inband.max() - inband.min() <= 0.5 and np.abs(inband).max() <= 0.5
    # Images of passband content (upsampling) and everything folding into the passband (downsampling)
    # come from at or above low - passband.
    assert db[freqs >= low - passband].max() <= -80.0


@pytest.mark.parametrize("pair", PAIRS)
def test_passband_tones_pass_within_half_a_db(pair: tuple[int, int]) -> None:
    _, passband = low_side(pair)
    in_rate, out_rate = pair
    for freq in (300.0, 1000.0, passband):
        y = stream(pair, tone(in_rate, freq, 0.4, 12000))
        steady = y[out_rate // 10 :]  # skip the start-up (well past the filter delay)
        level = amplitude_at(steady, out_rate, freq)
        assert abs(20 * np.log10(level / 12000)) <= 0.5, (freq, level)


@pytest.mark.parametrize("pair", [p for p in PAIRS if p[0] < p[1]])
def test_images_are_80_db_down(pair: tuple[int, int]) -> None:
    in_rate, out_rate = pair
    _, passband = low_side(pair)
    for freq in (1000.0, passband):
        y = stream(pair, tone(in_rate, freq, 0.4, 16000))[out_rate // 10 :]
        images = [k * in_rate + s * freq for k in range(1, out_rate // in_rate + 1) for s in (-1, 1)]
        for image in images:
            if 0 < image < out_rate / 2:
                assert amplitude_at(y, out_rate, image) <= 16000 * 10 ** (-80 / 20), (freq, image)


@pytest.mark.parametrize("pair", [p for p in PAIRS if p[0] > p[1]])
def test_aliases_into_the_passband_are_80_db_down(pair: tuple[int, int]) -> None:
    in_rate, out_rate = pair
    _, passband = low_side(pair)
    # Every input tone k * out_rate +- a above out_rate / 2 folds onto a; check a across the passband.
    for alias in (300.0, 1000.0, passband):
        folded = [k * out_rate + s * alias for k in range(1, in_rate // out_rate + 1) for s in (-1, 1)]
        for freq in [f for f in folded if out_rate / 2 < f < in_rate / 2]:
            y = stream(pair, tone(in_rate, freq, 0.4, 16000))[out_rate // 10 :]
            assert amplitude_at(y, out_rate, alias) <= 16000 * 10 ** (-80 / 20), (freq, alias)


@pytest.mark.parametrize("pair", PAIRS)
def test_batch_rows_equal_stream_resamplers_with_rows_opening_and_closing(pair: tuple[int, int]) -> None:
    rng = np.random.default_rng(11)
    batch = BatchResampler(*pair, capacity=2)
    streams: dict[int, StreamResampler] = {}
    for tick in range(12):
        if tick in (0, 3, 5, 8):  # open calls (grows past the initial capacity)
            for _ in range(3):
                streams[batch.open()] = StreamResampler(*pair)
        if tick in (4, 9):  # close one; its row is reused by a later open()
            row = sorted(streams)[1]
            batch.close(row)
            del streams[row]
        rows = np.array(sorted(streams, reverse=tick % 2 == 1), dtype=np.intp)
        x = rng.integers(-20000, 20000, size=(rows.shape[0], batch.in_frame), dtype=np.int16)
        y = batch.process(rows, x)
        assert y.shape == (rows.shape[0], batch.out_frame)
        for i, row in enumerate(rows):
            assert np.array_equal(y[i], streams[int(row)].process(x[i])), (tick, row)
    assert batch.capacity >= 8


def test_batch_with_many_rows_equals_stream() -> None:
    rng = np.random.default_rng(5)
    batch = BatchResampler(24000, 8000, capacity=4)
    rows = np.array([batch.open() for _ in range(300)])  # more than one 256-row chunk
    streams = [StreamResampler(24000, 8000) for _ in rows]
    for _ in range(3):
        x = rng.integers(-32768, 32768, size=(300, 480), dtype=np.int16)
        y = batch.process(rows, x)
        for i in range(0, 300, 37):
            assert np.array_equal(y[i], streams[i].process(x[i]))
        for i in set(range(300)) - set(range(0, 300, 37)):
            streams[i].process(x[i])


def test_errors() -> None:
    with pytest.raises(ResampleError):
        StreamResampler(8000, 16000)
    r = StreamResampler(8000, 24000)
    with pytest.raises(ResampleError):
        r.process(np.zeros(161, dtype=np.int16))
    with pytest.raises(ResampleError):
        r.process(np.zeros(160, dtype=np.float32))  # type: ignore[arg-type]
    b = BatchResampler(8000, 24000)
    row = b.open()
    b.close(row)
    with pytest.raises(ResampleError):
        b.close(row)
    with pytest.raises(ResampleError):
        b.process(np.array([row]), np.zeros((1, 160), dtype=np.int16))
    assert b.process(np.zeros(0, dtype=np.intp), np.zeros((0, 160), dtype=np.int16)).shape == (0, 480)


@settings(max_examples=25, deadline=None)
@given(
    pair=st.sampled_from(PAIRS),
    frames=st.integers(1, 6),
    data=st.data(),
)
def test_streamed_equals_whole_for_random_frames(pair: tuple[int, int], frames: int, data: st.DataObject) -> None:
    d = resample.design(*pair)
    x = data.draw(hnp.arrays(np.int16, d.in_frame * frames))
    y = stream(pair, x)
    assert np.array_equal(y, whole(pair, x, d.taps_int / 2.0**24))
    assert np.abs(y.astype(int) - whole(pair, x, d.taps).astype(int)).max() <= 1


def test_the_8k_round_trip_through_24k_delays_by_a_whole_number_of_samples() -> None:
    """Caller -> 24 kHz frames -> caller must not shift the waveform by a fraction of a sample."""
    from scipy import signal

    rng = np.random.default_rng(1)
    sos = signal.butter(8, [200, 3000], btype="bandpass", fs=8000, output="sos")
    x = (signal.sosfilt(sos, rng.standard_normal(16000)) * 8000).astype(np.int16)
    up, down = StreamResampler(8000, 24000), StreamResampler(24000, 8000)
    y = np.concatenate([down.process(up.process(x[i : i + 160])) for i in range(0, x.size, 160)])
    delay_24k = up.delay_ms * 24 + down.delay_ms * 24
    assert delay_24k % 3 == pytest.approx(0.0, abs=1e-9)
    lag = round(delay_24k / 3)
    n = x.size - lag
    assert np.corrcoef(x[:n], y[lag : lag + n])[0, 1] > 0.999
