"""Streaming and batched polyphase FIR resamplers between the telephony rates and the 24 kHz frame rate.

This module owns sample-rate conversion for 20 ms frames: 8000<->24000, 16000<->24000 and 48000<->24000.
Each direction is one rational polyphase FIR (up by L, low-pass at the intermediate rate, down by M),
designed once per rate pair with ``scipy.signal.remez`` and cached.

Filter specification (:data:`PAIR_SPECS`), for the lower rate ``fs`` of the pair and its passband ``fp``:

* passband 0 .. fp within +-0.2 dB: fp = 3.4 kHz (8 kHz side), 7 kHz (16 kHz side), 10 kHz (48 kHz
  <-> 24 kHz, where 24 kHz is the lower rate);
* stopband from ``fs - fp`` (4.6 kHz for 8 kHz, the G.712 edge), >= 82.5 dB by design. Upsampling: every
  image of passband content lies at or above ``fs - fp``, so all images are >= 80 dB down. Downsampling:
  everything that folds into the passband comes from at or above ``fs - fp``, so every alias that lands in
  the passband is >= 80 dB down; only content between fs/2 and fs - fp folds, into the band between fp
  and fs/2 above the passband, as G.712 allows for telephone channels. Moving the edge down to fs/2
  would double the taps (121 instead of 62 for 8 kHz) and the cost of the hottest loop of a media worker;
  see docs/adr/0003-exact-batched-resampling.md.

Streaming: output sample ``m`` of a stream is sample ``m`` of ``upfirdn(h, x, L, M)`` over the whole
signal, so there is no pre-roll beyond the filter's own group delay (:attr:`StreamResampler.delay_ms`),
and every 20 ms input frame yields exactly one 20 ms output frame.

Arithmetic is exact. Taps are quantized to integers scaled by 2**-24 and inputs are int16, so every
product and partial sum is an integer below 2**53 and float64 BLAS computes it exactly, in whatever order
the library chooses. That is what makes a :class:`BatchResampler` row bit-identical to a
:class:`StreamResampler` fed the same frames (float32 BLAS results depend on a row's position in the
matrix, see docs/adr/0003-exact-batched-resampling.md), and what keeps streamed output equal to
whole-signal filtering: the only rounding is the final one to int16.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import scipy.signal

__all__ = [
    "PAIR_SPECS",
    "BatchResampler",
    "FilterDesign",
    "PairSpec",
    "ResampleError",
    "StreamResampler",
    "design",
    "supported_pairs",
]

FRAME_MS: Final = 20
_COEFF_BITS: Final = 24  # taps are integers / 2**24: exact in float64 with int16 inputs (sums < 2**53)
_SCALE: Final = 1.0 / (1 << _COEFF_BITS)
_TILE: Final = 8  # preferred block width in outputs, see _pick_blocks
_ROW_CHUNK: Final = 256  # calls per matmul: bounds the scratch buffer and the working set


class ResampleError(ValueError):
    """Unsupported rate pair, wrong frame shape or dtype, or a row that is not open."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PairSpec:
    """Filter requirements for one conversion direction."""

    passband_hz: float
    stopband_hz: float
    numtaps: int


# numtaps: the smallest remez length (passband weight 1, stopband weight 300) whose quantized taps keep the
# passband within +-0.2 dB and the stopband at or below -82.5 dB for these edges. One prototype per pair
# serves both directions (same edges, same intermediate rate). The 8 kHz pair takes 61 taps: a linear-phase
# filter of N taps delays by (N - 1) / 2 samples at 24 kHz in each direction, and only when N - 1 is a
# multiple of 3 is the 8k -> 24k -> 8k round trip (a caller hearing the echo agent) a whole number of 8 kHz
# samples; a fractional third of a sample costs ~10 % correlation at 3 kHz. 61 still meets the passband and
# stopband tests (62 was the smallest even length found by search; odd lengths were not searched then).
PAIR_SPECS: Final[dict[tuple[int, int], PairSpec]] = {
    (8000, 24000): PairSpec(passband_hz=3400, stopband_hz=4600, numtaps=61),
    (24000, 8000): PairSpec(passband_hz=3400, stopband_hz=4600, numtaps=61),
    (16000, 24000): PairSpec(passband_hz=7000, stopband_hz=9000, numtaps=74),
    (24000, 16000): PairSpec(passband_hz=7000, stopband_hz=9000, numtaps=74),
    (48000, 24000): PairSpec(passband_hz=10000, stopband_hz=14000, numtaps=37),
    (24000, 48000): PairSpec(passband_hz=10000, stopband_hz=14000, numtaps=37),
}


def supported_pairs() -> tuple[tuple[int, int], ...]:
    return tuple(PAIR_SPECS)


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterDesign:
    """One direction's polyphase filter and the per-frame matrices derived from it.

    ``taps`` is the prototype low-pass at ``in_rate * up`` with gain ``up`` (float64, as designed);
    ``taps_int`` the same taps quantized to integers (value * 2**-24), which are what is applied.
    ``block`` is the (window, block_out) matrix shared by all ``blocks`` output blocks of a frame:
    block output i = sum over window sample j of ``window[j] * block[j, i]``. ``peak_gain`` is the largest
    sum of |weights| of any output, so no output exceeds ``peak_gain * max |input|``, and ``quiet_peak``
    the largest input magnitude that cannot drive any output past int16 (no clipping check needed).
    """

    in_rate: int
    out_rate: int
    up: int
    down: int
    taps: npt.NDArray[np.float64]
    taps_int: npt.NDArray[np.float64]
    in_frame: int
    out_frame: int
    history: int
    blocks: int
    block_in: int
    block_out: int
    block: npt.NDArray[np.float64]
    peak_gain: float
    quiet_peak: int

    @property
    def delay_ms(self) -> float:
        """Group delay of the linear-phase filter, in milliseconds."""
        return float((self.taps.shape[0] - 1) / 2 / (self.in_rate * self.up) * 1000.0)

    @property
    def window(self) -> int:
        return self.history + self.block_in


def _pick_blocks(in_frame: int, out_frame: int, up: int, down: int, history: int) -> int:
    # Split a frame's outputs into blocks that each start on a whole input sample. More blocks waste fewer
    # multiplies on the zeros of the banded frame matrix; fewer blocks make larger, BLAS-friendlier
    # matmuls. Measured on x86-64 (AVX2, OpenBLAS's Haswell kernels): at least half the history in new
    # inputs per block, and a block width that is a multiple of 8 outputs, presumably OpenBLAS's register
    # tiles (the figures: docs/adr/0003-exact-batched-resampling.md).
    period_out = up // math.gcd(up, down)  # outputs per whole-input step
    best, best_tiled = 1, 0
    for blocks in range(1, out_frame + 1):
        if out_frame % blocks or (out_frame // blocks) % period_out or in_frame % blocks:
            continue
        if in_frame // blocks >= max(history // 2, 8):
            best = blocks
            if (out_frame // blocks) % _TILE == 0:
                best_tiled = blocks
    return best_tiled or best


@functools.cache
def design(in_rate: int, out_rate: int) -> FilterDesign:
    """The cached filter design for one direction (built once per process)."""
    spec = PAIR_SPECS.get((in_rate, out_rate))
    if spec is None:
        pairs = ", ".join(f"{a}->{b}" for a, b in PAIR_SPECS)
        raise ResampleError(f"unsupported rate pair {in_rate}->{out_rate}; supported: {pairs}")
    g = math.gcd(in_rate, out_rate)
    up, down = out_rate // g, in_rate // g
    rate = in_rate * up
    taps = up * scipy.signal.remez(
        spec.numtaps, [0, spec.passband_hz, spec.stopband_hz, rate / 2], [1, 0], weight=[1, 300], fs=rate
    ).astype(np.float64)
    taps_int = np.round(taps * (1 << _COEFF_BITS))
    in_frame = in_rate * FRAME_MS // 1000
    out_frame = out_rate * FRAME_MS // 1000
    history = (taps.shape[0] - 1) // up
    blocks = _pick_blocks(in_frame, out_frame, up, down, history)
    block_in, block_out = in_frame // blocks, out_frame // blocks
    # block[j, i]: weight of window sample j (window starts `history` samples before the block's first new
    # input) in block output i: taps_int[i*down - (j - history)*up] where that index is a tap.
    j = np.arange(history + block_in)[:, None]
    i = np.arange(block_out)[None, :]
    k = i * down - (j - history) * up
    valid = (k >= 0) & (k < taps.shape[0])
    # Scaling by a power of two keeps every product and partial sum exact (it only moves the exponent).
    block = np.where(valid, taps_int[np.clip(k, 0, taps.shape[0] - 1)] * _SCALE, 0.0)
    block = np.ascontiguousarray(block, dtype=np.float64)
    for array in (taps, taps_int, block):
        array.flags.writeable = False
    peak_gain = float(np.abs(block).sum(axis=0).max())
    return FilterDesign(
        in_rate=in_rate,
        out_rate=out_rate,
        up=up,
        down=down,
        taps=taps,
        taps_int=taps_int,
        in_frame=in_frame,
        out_frame=out_frame,
        history=history,
        blocks=blocks,
        block_in=block_in,
        block_out=block_out,
        block=block,
        peak_gain=peak_gain,
        quiet_peak=math.floor(32767.0 / peak_gain),
    )


def _windows(d: FilterDesign, buf: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """The overlapping input windows of a C-contiguous ``buf`` (n, history + in_frame) as a view.

    The window of output block b is the column slice ``buf[:, b*block_in : b*block_in + window]``; stacked
    as (blocks, n, window), each slice is a plain BLAS operand (row stride >= window), so numpy runs one
    gemm per block with no window copy. (Built with the ndarray constructor: ``as_strided`` costs more than the
    products it feeds at small N; docs/performance/2026-12-07-figures-from-comments.md.)
    """
    n, width = buf.shape
    item = buf.itemsize
    return np.ndarray(
        shape=(d.blocks, n, d.window),
        dtype=np.float64,
        buffer=buf,
        strides=(d.block_in * item, width * item, item),
    )


def _round_into(acc: npt.NDArray[np.float64], out: npt.NDArray[np.int16], *, may_saturate: bool) -> None:
    """Round the exact sums to int16 into ``out``, saturating: the only rounding of the whole path.

    ``may_saturate=False`` is the caller's promise (from :func:`_is_loud` on every input in the windows)
    that every value lies within [-32767, 32767], so the float64 -> int16 cast cannot overflow and the two
    range reductions are skipped.
    """
    if may_saturate and (acc.max(initial=0.0) > 32767.0 or acc.min(initial=0.0) < -32768.0):
        np.clip(acc, -32768.0, 32767.0, out=acc)
    np.rint(acc, out=acc)  # round half to even, as np.rint over the whole signal
    np.copyto(out, acc, casting="unsafe")


def _is_loud(d: FilterDesign, x: npt.NDArray[np.int16]) -> bool:
    """Whether outputs whose windows hold these samples may need clipping (any |sample| > quiet_peak).

    |output| <= peak_gain * the largest |input| in its window, so a frame at or below ``quiet_peak`` cannot
    saturate. Two reductions over the int16 inputs cost less than two over the float64 outputs, and speech
    seldom comes that close to full scale (quiet_peak is about half of it).
    """
    return int(x.max()) > d.quiet_peak or int(x.min()) < -d.quiet_peak


def _check_frames(d: FilterDesign, x: npt.NDArray[np.int16], ndim: int) -> None:
    if not isinstance(x, np.ndarray) or x.dtype != np.int16 or x.ndim != ndim or x.shape[-1] != d.in_frame:
        want = f"int16[{d.in_frame}]" if ndim == 1 else f"int16[N, {d.in_frame}]"
        got = f"{getattr(x, 'dtype', type(x).__name__)}{list(getattr(x, 'shape', ()))}"
        raise ResampleError(f"{d.in_rate}->{d.out_rate} needs {want} per 20 ms, got {got}")


class StreamResampler:
    """One call's resampler: a 20 ms frame in, a 20 ms frame out, filter state kept across frames."""

    __slots__ = ("_buf", "_design", "_last_loud", "_windows")

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self._design = design(in_rate, out_rate)
        d = self._design
        self._buf = np.zeros((1, d.history + d.in_frame), dtype=np.float64)
        self._windows = _windows(d, self._buf)  # a fixed view of the fixed buffer
        self._last_loud = False  # the previous frame (the history in the next windows) was loud

    @property
    def in_rate(self) -> int:
        return self._design.in_rate

    @property
    def out_rate(self) -> int:
        return self._design.out_rate

    @property
    def in_frame(self) -> int:
        """Input samples per 20 ms frame."""
        return self._design.in_frame

    @property
    def out_frame(self) -> int:
        """Output samples per 20 ms frame."""
        return self._design.out_frame

    @property
    def delay_ms(self) -> float:
        """Group delay: output sample t shows the input at t - delay."""
        return self._design.delay_ms

    def reset(self) -> None:
        """Forget the history (as if newly constructed)."""
        self._buf[:] = 0.0
        self._last_loud = False

    def process(self, x: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        """Resample one frame: int16[in_frame] -> int16[out_frame]."""
        d = self._design
        _check_frames(d, x, 1)
        buf = self._buf
        h = d.history
        buf[0, h:] = x
        loud = _is_loud(d, x)
        # (blocks, 1, block_out) is already in time order for a single row: same products, same rounding
        # as a BatchResampler row.
        acc = np.matmul(self._windows, d.block)
        frame = np.empty(d.out_frame, dtype=np.int16)
        _round_into(acc.reshape(d.out_frame), frame, may_saturate=loud or self._last_loud)
        self._last_loud = loud
        buf[0, :h] = buf[0, d.in_frame :]  # the last `history` inputs become the next frame's history
        return frame


class BatchResampler:
    """Many calls' resamplers in one object: one (N, in_frame) array per tick, one matmul per output block.

    Each call owns a row from :meth:`open` until :meth:`close`; :meth:`process` takes the rows present this
    tick (any subset, any order, no duplicates) and their frames, and returns their output frames in the
    same order. A row's output is bit-identical to a :class:`StreamResampler` fed the same frames.

    State: row r of ``_history`` holds the call's last ``history`` input samples. Each chunk of a tick is
    assembled in a scratch buffer (histories, then the new frames) that stays cache-warm from tick to tick.
    When a tick's rows are one ascending run (the usual case: the media tick passes its calls in a stable
    order and rows are handed out low first), histories move in and out with slice copies; any other
    order gathers and scatters them by index. Both paths run the same products on the same values.
    """

    __slots__ = (
        "_acc",
        "_by_time",
        "_design",
        "_free",
        "_history",
        "_index",
        "_is_open",
        "_loud",
        "_matrix",
        "_scratch",
        "_scratch_windows",
    )

    def __init__(self, in_rate: int, out_rate: int, *, capacity: int = 64) -> None:
        if capacity < 1:
            raise ResampleError(f"capacity must be >= 1, got {capacity}")
        self._design = design(in_rate, out_rate)
        d = self._design
        self._history = np.zeros((capacity, d.history), dtype=np.float64)
        # Whether each row's last frame may have been loud (set for every row of a tick with a loud frame:
        # an upper bound, so rows are judged without per-row reductions).
        self._loud = np.zeros(capacity, dtype=bool)
        self._is_open = np.zeros(capacity, dtype=bool)
        self._index = np.arange(capacity, dtype=np.intp)
        self._free: list[int] = list(range(capacity - 1, -1, -1))  # pop() hands out low rows first
        self._scratch = np.empty((_ROW_CHUNK, d.history + d.in_frame), dtype=np.float64)
        # Orientation of the products. windows @ block gives (rows, block_out), the output's own layout;
        # block.T @ windows.T gives (block_out, rows), which OpenBLAS runs faster for these shapes (the calls
        # become its long dimension; ADR 0003) but leaves the result time-major, and transposing it into the
        # (N, out_frame) output costs a few plain copies. That pays where the output frame is
        # the short side (downsampling), not where it is three times the input (8k -> 24k).
        self._by_time = d.out_frame < d.in_frame
        self._matrix = np.ascontiguousarray(d.block.T) if self._by_time else d.block
        # The products' results, (count, out_frame) or (out_frame, count), contiguous for every count: a column
        # slice of a wider buffer was slower to round and copy (docs/performance/2026-12-07-figures-from-comments.md).
        self._acc = np.empty(_ROW_CHUNK * d.out_frame, dtype=np.float64)
        # The windows of the scratch rows, as the products read them, built once (a view costs about as
        # much per tick as a few hundred multiplies).
        windows = _windows(d, self._scratch)
        self._scratch_windows = windows.transpose(0, 2, 1) if self._by_time else windows

    @property
    def in_frame(self) -> int:
        return self._design.in_frame

    @property
    def out_frame(self) -> int:
        return self._design.out_frame

    @property
    def delay_ms(self) -> float:
        return self._design.delay_ms

    @property
    def capacity(self) -> int:
        return int(self._history.shape[0])

    @property
    def open_rows(self) -> int:
        return int(np.count_nonzero(self._is_open))

    def open(self) -> int:
        """Allocate a zeroed state row for a new call and return its index (grows the table when full)."""
        if not self._free:
            self._grow()
        row = self._free.pop()
        self._clear(row)
        self._is_open[row] = True
        return row

    def close(self, row: int) -> None:
        """Free a row; its index may be handed out again by :meth:`open`."""
        if not 0 <= row < self.capacity or not self._is_open[row]:
            raise ResampleError(f"row {row} is not open")
        self._is_open[row] = False
        self._free.append(row)

    def reset(self, row: int) -> None:
        """Zero one open row's history (a new stream on the same call)."""
        if not 0 <= row < self.capacity or not self._is_open[row]:
            raise ResampleError(f"row {row} is not open")
        self._clear(row)

    def process(self, rows: npt.NDArray[np.intp], x: npt.NDArray[np.int16]) -> npt.NDArray[np.int16]:
        """Resample one frame for each of ``rows``: int16 (N, in_frame) -> int16 (N, out_frame)."""
        d = self._design
        _check_frames(d, x, 2)
        rows = np.asarray(rows, dtype=np.intp)
        if rows.ndim != 1 or rows.shape[0] != x.shape[0]:
            raise ResampleError(f"rows {rows.shape} do not match frames {x.shape}")
        n = rows.shape[0]
        out = np.empty((n, d.out_frame), dtype=np.int16)
        if n == 0:
            return out
        first, last = int(rows[0]), int(rows[-1])
        # One ascending run of rows (first, first + 1, ..., last)? Checked against a stored arange: one
        # comparison instead of np.diff's three array operations (each costs microseconds per tick), and
        # count_nonzero instead of .all() (a plain C loop, not a ufunc reduction: about half the fixed cost).
        run = last - first == n - 1 and first >= 0 and last < self.capacity
        run = run and np.count_nonzero(rows != self._index[first : last + 1]) == 0
        picked: slice | npt.NDArray[np.intp] = slice(first, last + 1) if run else rows
        try:
            all_open = np.count_nonzero(self._is_open[picked]) == n and (run or int(rows.min()) >= 0)
        except IndexError:
            all_open = False
        if not all_open:
            raise ResampleError("process() got a row that is not open")
        loud = _is_loud(d, x)
        was_loud = bool(np.count_nonzero(self._loud[picked]))
        if loud or was_loud:  # quiet ticks after quiet ticks (the usual case) write nothing
            self._loud[picked] = loud
        may_saturate = loud or was_loud
        h = d.history
        for start in range(0, n, _ROW_CHUNK):
            stop = min(n, start + _ROW_CHUNK)
            count = stop - start
            buf = self._scratch[:count]  # a prefix of a C-contiguous array is C-contiguous
            windows = self._scratch_windows[..., :count] if self._by_time else self._scratch_windows[:, :count]
            lo, hi = first + start, first + stop  # the rows' span when they are a run
            buf[:, :h] = self._history[lo:hi] if run else self._history[rows[start:stop]]
            buf[:, h:] = x[start:stop]
            flat = self._acc[: count * d.out_frame]
            if self._by_time:  # each block's gemm writes block_out rows of the (out_frame, count) result
                acc = flat.reshape(d.out_frame, count)
                np.matmul(self._matrix, windows, out=acc.reshape(d.blocks, d.block_out, count))
                _round_into(acc, out[start:stop].T, may_saturate=may_saturate)
            else:  # each block's gemm writes block_out columns of the (count, out_frame) result
                acc = flat.reshape(count, d.out_frame)
                np.matmul(windows, self._matrix, out=acc.reshape(count, d.blocks, d.block_out).transpose(1, 0, 2))
                _round_into(acc, out[start:stop], may_saturate=may_saturate)
            # The last `history` inputs become the next frame's history.
            if run:
                self._history[lo:hi] = buf[:, d.in_frame :]
            else:
                self._history[rows[start:stop]] = buf[:, d.in_frame :]
        return out

    def _clear(self, row: int) -> None:
        self._history[row] = 0.0
        self._loud[row] = False

    def _grow(self) -> None:
        old = self.capacity
        new = old * 2
        history = np.zeros((new, self._design.history), dtype=np.float64)
        history[:old] = self._history
        loud = np.zeros(new, dtype=bool)
        loud[:old] = self._loud
        is_open = np.zeros(new, dtype=bool)
        is_open[:old] = self._is_open
        self._history, self._loud, self._is_open = history, loud, is_open
        self._index = np.arange(new, dtype=np.intp)
        self._free.extend(range(new - 1, old - 1, -1))
