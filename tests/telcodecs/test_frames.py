"""The frame contract helpers: the frame, its unchecked twin, and the level in dBFS."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from telcodecs import frames


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
