"""The tick's side of early media: the ringback cadence, a looping prompt, and a greeting's end."""

from __future__ import annotations

import numpy as np

from gateway.media.early import GREETING_DONE_S, RINGBACK_HZ, EarlyMedia, ringback_frames
from telcodecs.frames import FRAME_SAMPLES, SAMPLE_RATE, unchecked_frame


def test_ringback_is_one_second_of_425_hz_then_four_of_silence() -> None:
    frames = ringback_frames()
    assert len(frames) == 250  # 5 s of 20 ms frames
    pcm = np.concatenate([f.pcm for f in frames])
    on, off = pcm[:SAMPLE_RATE], pcm[SAMPLE_RATE:]
    assert not off.any()
    spectrum = np.abs(np.fft.rfft(on.astype(np.float64)))
    assert abs(np.argmax(spectrum) * SAMPLE_RATE / on.size - RINGBACK_HZ) < 2
    assert 0.19 < np.abs(on).max() / 32767 < 0.21  # -14 dBFS


def test_a_prompt_loops_and_counts_what_it_sent_and_heard() -> None:
    prompt = tuple(unchecked_frame(i, np.full(FRAME_SAMPLES, i + 1, np.int16)) for i in range(3))
    early = EarlyMedia(prompt)
    assert early.plays
    sent = [early.next_frame(100 + n) for n in range(7)]
    assert [int(f.pcm[0]) for f in sent] == [1, 2, 3, 1, 2, 3, 1] and sent[0].index == 100
    early.received(prompt[0])
    assert (early.sent, early.heard) == (7, 1)


def test_a_greeting_ends_after_its_audio_and_a_pause() -> None:
    done: list[bool] = []
    early = EarlyMedia(on_done=lambda: done.append(True))
    assert not early.plays
    for _ in range(50):
        early.sending(None)  # silence before the greeting's audio arrives does not end it
    assert not done
    frame = unchecked_frame(0, np.ones(FRAME_SAMPLES, np.int16))
    for _ in range(10):
        early.sending(frame)
    pause = round(GREETING_DONE_S / 0.02)
    for _ in range(pause - 1):
        early.sending(None)
    assert not done
    early.sending(frame)  # the audio went on: the pause starts again
    for _ in range(pause):
        early.sending(None)
    assert done == [True] and early.sent == 11
    early.sending(None)
    assert done == [True]  # told once
