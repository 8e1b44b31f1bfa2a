import numpy as np
import pytest

from gateway.loadtest import _codec
from gateway.loadtest.analysis import blockwise_match, chirp, echo_correlation, find_marker, summarize
from gateway.loadtest.audio import source_audio, speech_like


def _noise(n: int, seed: int = 1, level: float = 2000.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * level).astype(np.int16)


def test_marker_is_found_at_its_offset_under_noise() -> None:
    marker = chirp(8000)
    received = _noise(8000)
    received[3210 : 3210 + marker.size] += marker
    match = find_marker(received, marker)
    assert match is not None
    assert match.offset == 3210
    assert match.score > 0.7


def test_no_marker_in_plain_noise() -> None:
    assert find_marker(_noise(8000, seed=7), chirp(8000)) is None
    assert find_marker(_noise(8000, seed=7), chirp(8000), slips=_SLIPS) is None


_SLIPS = tuple(k * 80 for k in range(-4, 9) if k)  # 10 ms units at 8 kHz: two frames dropped .. four inserted


@pytest.mark.parametrize("dropped_at_ms", [17, 20, 23])
def test_marker_with_a_frame_dropped_from_its_middle_is_found_as_one_slip(dropped_at_ms: int) -> None:
    """A jitter buffer that sheds a 20 ms frame inside the 60 ms chirp leaves a whole-marker score below 0.5."""
    marker = chirp(8000)
    sent = _noise(8000, seed=11, level=300)
    sent[3200 : 3200 + marker.size] = marker
    cut = 3200 + dropped_at_ms * 8
    received = np.concatenate([sent[:cut], sent[cut + 160 :]])
    assert find_marker(received, marker) is None  # the whole marker alone misses it
    match = find_marker(received, marker, slips=_SLIPS)
    assert match is not None
    assert match.offset == 3200
    assert match.slip == -160
    assert match.score > 0.9


def test_marker_split_by_inserted_frames_reports_the_insertion() -> None:
    marker = chirp(8000)
    received = _noise(9000, seed=12, level=300)
    head, tail = marker[:240], marker[240:]
    received[4000:4240] = head
    received[4240:4560] = _noise(320, seed=13, level=3000)  # two frames of concealment, loud and unrelated
    received[4560 : 4560 + tail.size] = tail
    match = find_marker(received, marker, slips=_SLIPS)
    assert match is not None
    assert match.offset == 4000
    assert match.slip in (0, 320)  # whole-marker score may still pass; if split, the gap is two frames
    if match.slip:
        assert match.score > 0.9


def test_slip_tolerance_does_not_find_a_marker_in_speech() -> None:
    speech = speech_like(8000, 6.0, seed=3)
    for start in range(0, speech.size - 33600, 8000):
        assert find_marker(speech[start : start + 33600], chirp(8000), slips=_SLIPS) is None


def test_a_marker_whose_waveform_was_bent_is_found_by_its_spectrogram() -> None:
    """Sound kept, waveform not (as a codec may): the chirp's sign flipped in 20 ms pieces."""
    marker = chirp(8000)
    flips = np.repeat([1.0, -1.0, 1.0], marker.size // 3)[: marker.size]
    received = _noise(8000, seed=11, level=300)
    received[3210 : 3210 + marker.size] += (marker * flips).astype(np.int16)
    assert find_marker(received, marker, min_score=-1.0).score < 0.4  # the matched filter alone misses it
    match = find_marker(received, marker, slips=_SLIPS)
    assert match is not None and match.by_spectrogram and match.slip == 0
    assert match.score > 0.9
    assert abs(match.offset - 3210) <= 8  # within the spectrogram's hop (1 ms)


@pytest.mark.parametrize("rate", [8000, 48000])
def test_the_spectrogram_does_not_find_a_marker_in_speech(rate: int) -> None:
    speech = source_audio("speech", rate)
    marker = chirp(rate)
    for start in range(0, speech.size - 2 * rate, rate // 2):
        window = speech[start : start + 2 * rate]
        assert find_marker(window, marker) is None, f"a marker found in speech at {start / rate:.1f} s"


def test_echo_correlation_finds_lag_and_high_correlation() -> None:
    sent = _noise(16000, seed=3)
    received = np.concatenate([np.zeros(777, np.int16), sent, np.zeros(100, np.int16)])
    received = (received + _noise(received.size, seed=4, level=100)).astype(np.int16)
    match = echo_correlation(sent, received)
    assert match.lag == 777
    assert match.correlation > 0.99


def test_unrelated_audio_does_not_correlate() -> None:
    match = echo_correlation(_noise(8000, seed=5), _noise(8000, seed=6))
    assert abs(match.correlation) < 0.2


def test_summary_percentiles() -> None:
    s = summarize([float(v) for v in range(1, 101)])
    assert s.count == 100
    assert s.p50 == pytest.approx(50.5)
    assert s.max == 100.0
    assert summarize([]).count == 0


def _opus_round_trip(pcm: np.ndarray) -> np.ndarray:
    return np.asarray(_codec.decode(list(_codec.encode(pcm, "opus")), "opus"))


def _lag_of(sent: np.ndarray, received: np.ndarray) -> int:
    full = np.correlate(received[: sent.size + 2000].astype(float), sent[:9600].astype(float), mode="valid")
    return int(np.argmax(full))


def test_an_opus_round_trip_wobbles_but_does_not_slip_and_a_lost_frame_does() -> None:
    sent = source_audio("speech", 48000)[: 4 * 48000]  # espeak-ng's speech, as the load tester sends it
    decoded = _opus_round_trip(sent)
    lag = _lag_of(sent, decoded)
    kept = blockwise_match(sent, decoded, start=0, end=sent.size - 9600, lag=lag, block=4800, search=2120, min_slip=48)
    assert kept.slips == 0 and kept.score > 0.9
    # Counting every move of the best lag would count the codec's phase wobble as slips: no audio was lost.
    wobbly = blockwise_match(sent, decoded, start=0, end=sent.size - 9600, lag=lag, block=4800, search=2120)
    assert wobbly.score == kept.score
    # A jitter buffer dropping one 20 ms frame mid-way is counted once (the block over the cut, found between the
    # two alignments, is an excursion the next block does not confirm).
    cut = decoded.size // 2
    dropped = np.concatenate([decoded[:cut], decoded[cut + 960 :], np.zeros(960, np.int16)])
    for min_slip in (48, 240):
        lost = blockwise_match(
            sent, dropped, start=0, end=sent.size - 9600, lag=lag, block=4800, search=2120, min_slip=min_slip
        )
        assert lost.slips == 1 and lost.score > 0.9


def test_blocks_bent_out_of_line_for_a_while_are_not_slips_and_a_bend_that_stays_is_one() -> None:
    """Two blocks in a row found out of line, each somewhere else, then the rest in line: what two Opus passes and
    concealment did to a vowel in a CI run (10 ms late, then 10 ms early), counted as three slips before a
    slip had to be confirmed by the block after it."""
    sent = source_audio("speech", 48000)[: 4 * 48000]
    decoded = _opus_round_trip(sent)
    lag = _lag_of(sent, decoded)
    a = 2 * 48000 + lag  # where sent[96000:] came back
    bent = decoded.copy()
    bent[a : a + 4800] = decoded[a - 480 : a + 4320]  # this block is found 10 ms late
    bent[a + 4800 : a + 9600] = decoded[a + 5280 : a + 10080]  # the next one partly early, about 2 ms off
    slipped = np.concatenate([decoded[:a], decoded[a - 960 :]])  # a frame repeated: every block after, 20 ms late
    for min_slip in (48, 240):
        match = blockwise_match(
            sent, bent, start=0, end=sent.size - 9600, lag=lag, block=4800, search=2120, min_slip=min_slip
        )
        assert match.slips == 0
        match = blockwise_match(
            sent, slipped, start=0, end=sent.size - 9600, lag=lag, block=4800, search=2120, min_slip=min_slip
        )
        assert match.slips == 1
