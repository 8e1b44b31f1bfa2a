"""G.711 against an independent, table-driven reading of the G.191 reference rule."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from telcodecs import g711

ALL_SAMPLES = np.arange(-32768, 32768, dtype=np.int16)
ALL_CODES = np.arange(256, dtype=np.uint8)

# Independent statement of the G.191 rules with segment end points (G.711 Tables 1a/2a) instead of
# bit arithmetic, written in the test so the module is not checked against itself.
ULAW_SEGMENT_ENDS = [63, 127, 255, 511, 1023, 2047, 4095, 8191]  # on |x|/4 + 33 (14-bit magnitude + bias)


def reference_ulaw_encode(x: int) -> int:
    magnitude = (-x - 1 if x < 0 else x) // 4 + 33
    magnitude = min(magnitude, 8191)
    segment = next(i for i, end in enumerate(ULAW_SEGMENT_ENDS) if magnitude <= end)
    step_shift = segment + 1
    mantissa = (magnitude >> step_shift) - 16
    code = 0x7F - ((segment << 4) | mantissa)
    return code | 0x80 if x >= 0 else code


def reference_ulaw_decode(code: int) -> int:
    inverted = 0xFF - code
    segment, mantissa = (inverted >> 4) & 7, inverted & 15
    magnitude = ((2 * mantissa + 33) << (segment + 2)) - 132
    return magnitude if code >= 0x80 else -magnitude


def reference_alaw_encode(x: int) -> int:
    magnitude = (-x - 1 if x < 0 else x) // 16  # 0..2047 (12 bits)
    if magnitude < 32:
        code = magnitude  # segments 0 and 1 share the smallest step, so the code is the magnitude
    else:
        segment = magnitude.bit_length() - 4  # 32..63 -> 2, 64..127 -> 3, ..., 1024..2047 -> 7
        code = (segment << 4) | ((magnitude >> (segment - 1)) & 15)
    if x >= 0:
        code |= 0x80
    return code ^ 0x55


def reference_alaw_decode(code: int) -> int:
    value = code ^ 0x55
    segment, mantissa = (value >> 4) & 7, value & 15
    if segment == 0:
        magnitude = (mantissa << 4) + 8
    else:
        magnitude = ((mantissa + 16) << (segment + 3)) + (1 << (segment + 2))
    return magnitude if value & 0x80 else -magnitude


@pytest.mark.parametrize(
    ("encode", "reference"),
    [(g711.ulaw_encode, reference_ulaw_encode), (g711.alaw_encode, reference_alaw_encode)],
)
def test_encode_matches_reference_for_all_65536_inputs(encode, reference) -> None:
    want = np.array([reference(int(x)) for x in ALL_SAMPLES], dtype=np.uint8)
    got = np.frombuffer(encode(ALL_SAMPLES), dtype=np.uint8)
    assert np.array_equal(got, want)


@pytest.mark.parametrize(
    ("decode", "reference"),
    [(g711.ulaw_decode, reference_ulaw_decode), (g711.alaw_decode, reference_alaw_decode)],
)
def test_decode_matches_reference_for_all_256_codes(decode, reference) -> None:
    want = np.array([reference(c) for c in range(256)], dtype=np.int16)
    assert np.array_equal(decode(bytes(range(256))), want)
    assert np.array_equal(decode(ALL_CODES), want)


def test_known_reference_values() -> None:
    # Spot values from the G.191 rule: full scale, the smallest steps and both zeros.
    assert g711.ulaw_encode(np.array([32767, -32768, 0, -1, 4, -5], dtype=np.int16)) == bytes(
        [0x80, 0x00, 0xFF, 0x7F, 0xFE, 0x7E]
    )
    assert g711.alaw_encode(np.array([32767, -32768, 0, -1], dtype=np.int16)) == bytes([0xAA, 0x2A, 0xD5, 0x55])
    assert g711.ulaw_decode(bytes([0x80, 0x00, 0xFF, 0x7F])).tolist() == [32124, -32124, 0, 0]
    assert g711.alaw_decode(bytes([0xAA, 0x2A, 0xD5, 0x55])).tolist() == [32256, -32256, 8, -8]


def test_silence_codes() -> None:
    silence = np.zeros(160, dtype=np.int16)
    assert g711.ulaw_encode(silence) == bytes([g711.ULAW_SILENCE]) * 160 == b"\xff" * 160
    assert g711.alaw_encode(silence) == bytes([g711.ALAW_SILENCE]) * 160 == b"\xd5" * 160
    assert not g711.ulaw_decode(b"\xff" * 8).any()
    assert g711.alaw_decode(b"\xd5" * 8).tolist() == [8] * 8  # A-law has no exact zero: +half a step


@pytest.mark.parametrize(
    ("encode", "decode"), [(g711.ulaw_encode, g711.ulaw_decode), (g711.alaw_encode, g711.alaw_decode)]
)
def test_code_round_trip_is_stable_for_all_codes(encode, decode) -> None:
    levels = decode(ALL_CODES)
    assert np.array_equal(decode(encode(levels)), levels)


def test_audioop_differs_exactly_where_documented() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        audioop = pytest.importorskip("audioop")
    ulaw = np.frombuffer(audioop.lin2ulaw(ALL_SAMPLES.tobytes(), 2), dtype=np.uint8)
    alaw = np.frombuffer(audioop.lin2alaw(ALL_SAMPLES.tobytes(), 2), dtype=np.uint8)
    ours_u = g711.ulaw_encode_batch(ALL_SAMPLES[None])[0]
    differ = ulaw != ours_u
    assert int(differ.sum()) == 508
    assert (ALL_SAMPLES[differ] < 0).all()  # negate-then-shift vs one's complement: negatives only
    assert np.array_equal(alaw, g711.alaw_encode_batch(ALL_SAMPLES[None])[0])


def test_batched_equals_per_row() -> None:
    rng = np.random.default_rng(7)
    pcm = rng.integers(-32768, 32768, size=(37, 160), dtype=np.int16)
    for encode_batch, encode, decode_batch, decode in [
        (g711.ulaw_encode_batch, g711.ulaw_encode, g711.ulaw_decode_batch, g711.ulaw_decode),
        (g711.alaw_encode_batch, g711.alaw_encode, g711.alaw_decode_batch, g711.alaw_decode),
    ]:
        codes = encode_batch(pcm)
        assert codes.shape == pcm.shape and codes.dtype == np.uint8
        for row in range(pcm.shape[0]):
            assert codes[row].tobytes() == encode(pcm[row])
        decoded = decode_batch(codes)
        assert decoded.dtype == np.int16
        for row in range(pcm.shape[0]):
            assert np.array_equal(decoded[row], decode(codes[row].tobytes()))


def test_bad_input_is_refused() -> None:
    with pytest.raises(g711.G711Error):
        g711.ulaw_encode(np.zeros(4, dtype=np.float32))  # type: ignore[arg-type]
    with pytest.raises(g711.G711Error):
        g711.ulaw_encode_batch(np.zeros(4, dtype=np.int16))
    with pytest.raises(g711.G711Error):
        g711.alaw_decode_batch(np.zeros((2, 3), dtype=np.int16))  # type: ignore[arg-type]


@given(hnp.arrays(np.int16, st.integers(0, 400)))
def test_encode_decode_error_is_bounded_by_half_a_step(pcm: np.ndarray) -> None:
    for encode, decode, limit in [
        (g711.ulaw_encode, g711.ulaw_decode, 32124),
        (g711.alaw_encode, g711.alaw_decode, 32256),
    ]:
        out = decode(encode(pcm)).astype(np.int64)
        x = np.clip(pcm.astype(np.int64), -limit, limit)
        # The quantization step grows with the magnitude: at most 1/16 of it plus the smallest step.
        assert (np.abs(out - x) <= np.abs(x) // 16 + 16).all()


@given(st.binary(max_size=400))
def test_decode_encode_is_identity_on_canonical_codes(data: bytes) -> None:
    # Every code but µ-law's negative zero (0x7F decodes to 0, which encodes as 0xFF) is canonical.
    canonical = data.replace(b"\x7f", b"\xff")
    assert g711.ulaw_encode(g711.ulaw_decode(canonical)) == canonical
    assert g711.alaw_encode(g711.alaw_decode(data)) == data


def test_cross_law_translation_is_decode_then_encode_for_all_256_codes() -> None:
    codes = bytes(range(256))
    expected_ulaw = bytes(reference_ulaw_encode(reference_alaw_decode(c)) for c in codes)
    expected_alaw = bytes(reference_alaw_encode(reference_ulaw_decode(c)) for c in codes)
    assert g711.alaw_to_ulaw(codes) == expected_ulaw
    assert g711.ulaw_to_alaw(codes) == expected_alaw
    # A-law has no zero: its quietest code stands for +8, which mu-law codes one step above its zero
    assert g711.alaw_to_ulaw(bytes([g711.ALAW_SILENCE])) == b"\xfe"


@pytest.mark.parametrize(
    ("encode", "is_quiet"), [(g711.ulaw_encode, g711.ulaw_is_quiet), (g711.alaw_encode, g711.alaw_is_quiet)]
)
def test_quiet_means_no_sample_reaches_the_quiet_peak(encode, is_quiet) -> None:
    rng = np.random.default_rng(7)
    hiss = rng.integers(-200, 200, 160).astype(np.int16)  # line noise around -45 dBFS
    assert is_quiet(encode(np.zeros(160, np.int16))) and is_quiet(encode(hiss))
    speech = (3000 * np.sin(np.arange(160) * 0.3)).astype(np.int16)
    assert not is_quiet(encode(speech))
    one_click = hiss.copy()
    one_click[80] = g711.QUIET_PEAK + 64  # one sample over the peak is enough to count as sound
    assert not is_quiet(encode(one_click))
    assert is_quiet(b"")


def test_linear_samples_are_quiet_below_the_same_peak() -> None:
    pcm = np.zeros(960, dtype=np.int16)
    assert g711.pcm_is_quiet(pcm)
    for peak, quiet in ((g711.QUIET_PEAK - 1, True), (g711.QUIET_PEAK, False), (-g711.QUIET_PEAK, False)):
        pcm[300] = peak
        assert g711.pcm_is_quiet(pcm) is quiet
