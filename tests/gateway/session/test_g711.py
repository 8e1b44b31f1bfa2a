"""G.711 toward the provider: the caller's own codes pass through; other callers' frames are transcoded."""

from __future__ import annotations

import numpy as np
import pytest

from gateway.session.g711 import G711Transcoder
from telcodecs.frames import FRAME_SAMPLES, Frame
from telcodecs.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from telcodecs.resample import StreamResampler


def speechlike(seconds: float, rate: int, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(rate * seconds)) / rate
    x = 6000 * np.sin(2 * np.pi * 440 * t) + 2000 * np.sin(2 * np.pi * 1270 * t) + rng.normal(0, 300, t.size)
    return x.astype(np.int16)


def frames_with_codes(law: str, count: int) -> tuple[list[Frame], list[bytes]]:
    """Frames as the tick makes them for a G.711 caller: 24 kHz PCM plus the caller's codes."""
    encode = ulaw_encode if law == "pcmu" else alaw_encode
    decode = ulaw_decode if law == "pcmu" else alaw_decode
    up = StreamResampler(8000, 24000)
    signal8 = speechlike(count * 0.02, 8000)
    codes = [encode(signal8[k * 160 : (k + 1) * 160]) for k in range(count)]
    frames = []
    for k, c in enumerate(codes):
        pcm = up.process(decode(c))
        pcm.flags.writeable = False
        frames.append(Frame(index=k, pcm=pcm, g711=c, g711_law=law))  # type: ignore[arg-type]
    return frames, codes


@pytest.mark.parametrize("law", ["pcmu", "pcma"])
def test_the_callers_codes_reach_the_provider_unchanged(law: str) -> None:
    frames, codes = frames_with_codes(law, 10)
    transcoder = G711Transcoder(law)  # type: ignore[arg-type]
    assert transcoder.encode(frames[:4]) + transcoder.encode(frames[4:]) == b"".join(codes)


@pytest.mark.parametrize(("caller", "provider"), [("pcma", "pcmu"), ("pcmu", "pcma")])
def test_codes_in_the_other_law_go_through_the_tables_without_resampling(caller: str, provider: str) -> None:
    frames, codes = frames_with_codes(caller, 5)
    out = G711Transcoder(provider).encode(frames)  # type: ignore[arg-type]
    decode_caller = alaw_decode if caller == "pcma" else ulaw_decode
    decode_provider = ulaw_decode if provider == "pcmu" else alaw_decode
    encode_provider = ulaw_encode if provider == "pcmu" else alaw_encode
    assert len(out) == 5 * 160
    assert out == encode_provider(decode_caller(b"".join(codes)))
    # Sample for sample the same signal (no resampler delay), within the two laws' quantization.
    a = decode_caller(b"".join(codes)).astype(np.int64)
    b = decode_provider(out).astype(np.int64)
    assert np.max(np.abs(a - b)) <= np.max(np.abs(a)) // 16


def test_frames_without_codes_are_resampled_and_encoded_in_one_continuous_stream() -> None:
    signal24 = speechlike(0.2, 24000)
    frames = []
    for k in range(10):
        pcm = np.ascontiguousarray(signal24[k * FRAME_SAMPLES : (k + 1) * FRAME_SAMPLES])
        pcm.flags.writeable = False
        frames.append(Frame(index=k, pcm=pcm))
    transcoder = G711Transcoder("pcmu")
    out = transcoder.encode(frames[:3]) + transcoder.encode(frames[3:])
    down = StreamResampler(24000, 8000)
    expected = b"".join(ulaw_encode(down.process(f.pcm)) for f in frames)
    assert out == expected
