"""The sans-I/O half of recordings: a tick's two frames -> interleaved PCM16 at the recording's rate; WAV headers."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest

from gateway.media.recording import RecordingMixdown, RecordingTrack, channels_of, wav_header
from gateway.media.tick import G711Frame
from telcodecs.frames import FRAME_SAMPLES, Frame
from telcodecs.g711 import ulaw_encode
from telcodecs.resample import StreamResampler


def _tone(freq: float, frames: int, rate: int = 24_000, amp: float = 8000.0) -> np.ndarray:
    t = np.arange(frames * rate // 50) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def _frames(pcm: np.ndarray) -> list[Frame]:
    count = len(pcm) // FRAME_SAMPLES
    return [Frame(index=i, pcm=pcm[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES]) for i in range(count)]


def _one(mixdown: RecordingMixdown, track: RecordingTrack, tick: int, caller: Frame | None, agent: object) -> bytes:
    [data] = mixdown.mix(tick, [(track, caller, agent)])  # type: ignore[list-item]
    return data


def test_both_puts_the_caller_left_and_the_agent_right_on_the_same_samples() -> None:
    caller = _frames(_tone(300, 10))
    agent = _frames(_tone(700, 10))
    mixdown = RecordingMixdown()
    track = mixdown.open(mode="both", sample_rate=24_000)
    data = b"".join(_one(mixdown, track, i, caller[i], agent[i]) for i in range(10))
    stereo = np.frombuffer(data, dtype="<i2").reshape(-1, 2)
    assert np.array_equal(stereo[:, 0], np.concatenate([f.pcm for f in caller]))
    assert np.array_equal(stereo[:, 1], np.concatenate([f.pcm for f in agent]))


def test_16k_is_the_exact_streaming_resampler_of_each_side_whatever_else_is_mixed() -> None:
    caller = _frames(_tone(440, 8))
    agent = _frames(_tone(900, 8))
    mixdown = RecordingMixdown()
    tracks = [mixdown.open(mode="both", sample_rate=16_000), mixdown.open(mode="caller", sample_rate=16_000)]
    other = mixdown.open(mode="agent", sample_rate=8000)
    got: list[list[bytes]] = [[], [], []]
    for i in range(8):
        entries = [(tracks[0], caller[i], agent[i]), (other, None, agent[i]), (tracks[1], caller[i], None)]
        for k, data in enumerate(mixdown.mix(i, entries)):
            got[k].append(data)
    both = np.frombuffer(b"".join(got[0]), dtype="<i2").reshape(-1, 2)
    alone = np.frombuffer(b"".join(got[2]), dtype="<i2")
    left, right, solo = (
        StreamResampler(24_000, 16_000),
        StreamResampler(24_000, 16_000),
        StreamResampler(24_000, 16_000),
    )
    assert np.array_equal(both[:, 0], np.concatenate([left.process(f.pcm) for f in caller]))
    assert np.array_equal(both[:, 1], np.concatenate([right.process(f.pcm) for f in agent]))
    assert np.array_equal(alone, np.concatenate([solo.process(f.pcm) for f in caller]))
    down8 = StreamResampler(24_000, 8000)
    assert np.array_equal(
        np.frombuffer(b"".join(got[1]), dtype="<i2"), np.concatenate([down8.process(f.pcm) for f in agent])
    )
    assert len(alone) == 8 * 320
    mixdown.close(tracks[1])
    again = mixdown.open(mode="caller", sample_rate=16_000)  # a row handed out again starts from zero history
    fresh = StreamResampler(24_000, 16_000)
    assert np.array_equal(
        np.frombuffer(_one(mixdown, again, 0, caller[0], None), dtype="<i2"), fresh.process(caller[0].pcm)
    )


def test_agent_g711_codes_are_decoded_and_silence_is_zeros() -> None:
    mixdown = RecordingMixdown()
    track = mixdown.open(mode="agent", sample_rate=8000)
    tone8 = _tone(500, 5, rate=8000)
    codes = [ulaw_encode(tone8[i * 160 : (i + 1) * 160]) for i in range(5)]
    outs = [_one(mixdown, track, i, None, G711Frame(index=i, g711=codes[i], g711_law="pcmu")) for i in range(5)]
    pcm = np.frombuffer(b"".join(outs), dtype="<i2")
    assert len(pcm) == 5 * 160
    assert np.abs(pcm[160:]).max() > 4000  # the tone came through (after the filters' delay)
    tail = [_one(mixdown, track, i, None, None) for i in range(5, 9)]  # silence, once the filters' tail has played
    assert tail[0] != bytes(320) and tail[-1] == bytes(320)


def test_a_missed_tick_is_silence_so_what_follows_stays_aligned() -> None:
    frame = _frames(_tone(300, 1))[0]
    mixdown = RecordingMixdown()
    track = mixdown.open(mode="both", sample_rate=24_000)
    first = _one(mixdown, track, 10, frame, frame)
    later = _one(mixdown, track, 13, frame, frame)  # ticks 11 and 12 never reached the writer
    assert len(first) == track.frame_bytes == 4 * FRAME_SAMPLES
    assert len(later) == 3 * track.frame_bytes
    assert later[: 2 * track.frame_bytes] == bytes(2 * track.frame_bytes)


def test_bad_modes_and_rates_are_refused() -> None:
    with pytest.raises(ValueError, match="other than off"):
        RecordingMixdown().open(mode="off", sample_rate=16_000)
    with pytest.raises(ValueError, match="sample rate"):
        RecordingMixdown().open(mode="both", sample_rate=44_100)
    assert channels_of("both") == 2 and channels_of("caller") == 1


def test_wav_header_final_and_streaming_forms_are_read_by_the_stdlib() -> None:
    data = np.arange(320, dtype="<i2").tobytes()
    for size in (len(data), None):
        blob = wav_header(sample_rate=16_000, channels=2, data_bytes=size) + data
        with wave.open(io.BytesIO(blob)) as reader:
            assert (reader.getnchannels(), reader.getframerate(), reader.getsampwidth()) == (2, 16_000, 2)
            assert reader.readframes(1000) == data  # the streaming form: until the end of the file
