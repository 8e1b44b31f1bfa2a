"""Repeat-and-fade concealment for the rows of a batch (gateway/media/plc.py)."""

from __future__ import annotations

import numpy as np

from gateway.media import jitter
from gateway.media.plc import RepeatAndFade


def _conceal(plc: RepeatAndFade, rows: list[int], status: list[int], played: list[bool]) -> np.ndarray:
    pcm = np.full((len(rows), plc.samples), 1234, dtype=np.int16)  # what a missing row held before: overwritten
    plc.conceal(pcm, np.array(rows, dtype=np.intp), np.array(status, dtype=np.int8), np.array(played))
    return pcm


def test_a_lost_frame_repeats_the_last_one_under_a_fade_continuous_across_frames() -> None:
    plc = RepeatAndFade(samples=4, fade_frames=2)
    plc.open(0)
    plc.played(np.array([0], dtype=np.intp), np.full((1, 4), 1000, dtype=np.int16))
    first = _conceal(plc, [0], [jitter.CONCEALED], [False])[0]
    second = _conceal(plc, [0], [jitter.CONCEALED], [False])[0]
    third = _conceal(plc, [0], [jitter.CONCEALED], [False])[0]
    # Gains fall linearly from 1 to 0 over two frames, sample by sample: 1000 * (1 - k/8) for k = 1..8.
    assert first.tolist() == [875, 750, 625, 500]
    assert second.tolist() == [375, 250, 125, 0]
    assert third.tolist() == [0, 0, 0, 0]


def test_a_frame_the_buffer_calls_silence_is_silent_at_once_and_ends_the_fade() -> None:
    plc = RepeatAndFade(samples=4, fade_frames=3)
    plc.open(0)
    plc.played(np.array([0], dtype=np.intp), np.full((1, 4), 1000, dtype=np.int16))
    assert _conceal(plc, [0], [jitter.SILENT], [False])[0].tolist() == [0, 0, 0, 0]
    assert _conceal(plc, [0], [jitter.CONCEALED], [False])[0].tolist() == [0, 0, 0, 0]  # nothing left to repeat


def test_rows_are_independent_and_played_rows_are_left_alone() -> None:
    plc = RepeatAndFade(samples=2, fade_frames=1)
    for row in (0, 1):
        plc.open(row)
    plc.played(np.array([0, 1], dtype=np.intp), np.array([[100, 100], [-800, -800]], dtype=np.int16))
    pcm = _conceal(plc, [0, 1], [jitter.CONCEALED, jitter.CONCEALED], [True, False])
    assert pcm[0].tolist() == [1234, 1234]  # played: not touched
    assert pcm[1].tolist() == [-400, 0]


def test_a_new_call_on_a_row_beyond_the_history_grows_it_and_starts_silent() -> None:
    plc = RepeatAndFade(samples=3, fade_frames=3)
    plc.open(200)
    assert _conceal(plc, [200], [jitter.CONCEALED], [False])[0].tolist() == [0, 0, 0]
    plc.played(np.array([200], dtype=np.intp), np.full((1, 3), 300, dtype=np.int16))
    plc.open(200)  # the row is reused by the next call: its history is forgotten
    assert _conceal(plc, [200], [jitter.CONCEALED], [False])[0].tolist() == [0, 0, 0]
