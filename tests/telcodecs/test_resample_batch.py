"""BatchResampler's two state paths (rows in one ascending run, rows in any other order) and saturation."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.signal
from hypothesis import given, settings
from hypothesis import strategies as st

from telcodecs import resample
from telcodecs.resample import BatchResampler, StreamResampler

PAIRS = [(8000, 24000), (24000, 8000), (16000, 24000), (24000, 16000), (48000, 24000), (24000, 48000)]


def whole(pair: tuple[int, int], x: np.ndarray) -> np.ndarray:
    """Whole-signal filtering with the applied taps, rounded and saturated: the independent reference."""
    d = resample.design(*pair)
    y = scipy.signal.upfirdn(d.taps_int / 2.0**24, x.astype(np.float64), d.up, d.down)
    n = x.shape[0] * pair[1] // pair[0]
    return np.clip(np.rint(y[:n]), -32768, 32767).astype(np.int16)


@pytest.mark.parametrize("pair", PAIRS)
def test_design_invariants_the_fast_paths_rely_on(pair: tuple[int, int]) -> None:
    d = resample.design(*pair)
    # A window spans the current frame and at most the previous one (the saturation bound tracks one frame).
    assert d.history <= d.in_frame
    # peak_gain bounds every output: the sum of |weights| of the worst output, on the applied taps; a frame
    # at or below quiet_peak cannot drive an output past int16.
    assert d.peak_gain == pytest.approx(float(np.abs(d.block).sum(axis=0).max()))
    assert d.quiet_peak * d.peak_gain <= 32767.0 < (d.quiet_peak + 1) * d.peak_gain
    assert d.blocks * d.block_out == d.out_frame and d.blocks * d.block_in == d.in_frame


@pytest.mark.parametrize("pair", PAIRS)
@pytest.mark.parametrize("order", ["run", "reversed", "gapped"])
def test_loud_frames_then_quiet_ones_saturate_like_whole_signal_filtering(pair: tuple[int, int], order: str) -> None:
    """A full-scale frame followed by a quiet one: the quiet frame's outputs still see the loud history."""
    batch = BatchResampler(*pair, capacity=4)
    rows = np.array([batch.open() for _ in range(4)], dtype=np.intp)
    if order == "reversed":
        rows = rows[::-1].copy()
    elif order == "gapped":
        rows = rows[[0, 2, 3]]
    n = rows.shape[0]
    d = resample.design(*pair)
    rng = np.random.default_rng(7)
    loud = np.where(rng.random((n, d.in_frame)) < 0.5, -32768, 32767).astype(np.int16)  # square-ish noise
    quiet = rng.integers(-200, 200, size=(n, d.in_frame), dtype=np.int16)
    frames = [quiet, loud, quiet, quiet, loud // 3, quiet]
    got = np.concatenate([batch.process(rows, f) for f in frames], axis=1)
    for i in range(n):
        signal = np.concatenate([f[i] for f in frames])
        assert np.array_equal(got[i], whole(pair, signal)), (order, i)
    assert got.max() == 32767 and got.min() == -32768  # the loud frames did saturate


@pytest.mark.parametrize("pair", [(8000, 24000), (24000, 8000)])
def test_run_of_rows_equals_the_same_rows_in_another_order(pair: tuple[int, int]) -> None:
    """The slice path (one ascending run) and the gather/scatter path give identical rows."""
    rng = np.random.default_rng(2)
    by_slices, gathered = BatchResampler(*pair, capacity=300), BatchResampler(*pair, capacity=300)
    rows = np.array([by_slices.open() for _ in range(300)], dtype=np.intp)  # 0..299: more than one chunk
    for _ in range(300):
        gathered.open()
    perm = rng.permutation(300)
    for tick in range(4):
        x = rng.integers(-30000, 30000, size=(300, by_slices.in_frame), dtype=np.int16)
        y_run = by_slices.process(rows, x)
        if tick == 2:  # the run path on a sub-range (rows 100..199) leaves the other rows' state alone
            y_run[100:200] = by_slices.process(rows[100:200], x[100:200])
            gathered.process(rows[100:200][::-1].copy(), x[100:200][::-1].copy())
        y_perm = gathered.process(perm, x[perm])
        assert np.array_equal(y_run[perm], y_perm), tick


@st.composite
def ticks(draw: st.DrawFn) -> list[tuple[str, int]]:
    return draw(
        st.lists(
            st.tuples(st.sampled_from(["open", "close", "reset", "tick", "tick", "tick"]), st.integers(0, 2**16)),
            min_size=1,
            max_size=14,
        )
    )


@settings(max_examples=40, deadline=None)
@given(pair=st.sampled_from(PAIRS), steps=ticks(), loud=st.booleans())
def test_batch_rows_equal_streams_under_random_open_close_and_orders(
    pair: tuple[int, int], steps: list[tuple[str, int]], loud: bool
) -> None:
    batch = BatchResampler(*pair, capacity=2)
    streams: dict[int, StreamResampler] = {}
    for action, seed in steps:
        rng = np.random.default_rng(seed)
        if action == "open" or not streams:
            streams[batch.open()] = StreamResampler(*pair)
        elif action == "close":
            row = sorted(streams)[seed % len(streams)]
            batch.close(row)
            del streams[row]
            continue
        elif action == "reset":
            row = sorted(streams)[seed % len(streams)]
            batch.reset(row)
            streams[row].reset()
        present = sorted(streams)
        kind = seed % 3  # 0: ascending (a run when no row is missing), 1: shuffled, 2: an ascending subset
        if kind == 1:
            present = [int(r) for r in rng.permutation(present)]
        elif kind == 2:
            present = present[seed % len(present) :]
        rows = np.array(present, dtype=np.intp)
        scale = 32768 if loud else 3000
        x = rng.integers(-scale, scale, size=(rows.shape[0], batch.in_frame), dtype=np.int16)
        y = batch.process(rows, x)
        for i, row in enumerate(present):
            assert np.array_equal(y[i], streams[row].process(x[i]))
