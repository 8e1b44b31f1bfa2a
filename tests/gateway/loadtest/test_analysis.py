import numpy as np
import pytest

from gateway.loadtest.analysis import ReceiveStats, chirp, echo_correlation, find_marker, summarize


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


def test_receive_stats_counts_loss_duplicates_and_wrap() -> None:
    stats = ReceiveStats(8000)
    seqs = [65530 + i for i in range(12)]  # wraps past 65535
    seqs = [s & 0xFFFF for s in seqs]
    lost = {seqs[3], seqs[8]}
    t = 0.0
    for i, seq in enumerate(seqs):
        if seq in lost:
            continue
        stats.packet(seq, i * 160, t + i * 0.02)
    stats.packet(seqs[5], 5 * 160, 0.2)  # duplicate
    assert stats.expected == 12
    assert stats.lost == 2
    assert stats.duplicates == 1
    assert stats.received == 10


def test_jitter_is_zero_for_perfect_pacing_and_grows_with_variation() -> None:
    steady = ReceiveStats(8000)
    shaky = ReceiveStats(8000)
    for i in range(100):
        steady.packet(i, i * 160, i * 0.02)
        shaky.packet(i, i * 160, i * 0.02 + (0.005 if i % 2 else 0.0))
    assert steady.jitter_ms == pytest.approx(0.0, abs=1e-9)
    assert 3.0 < shaky.jitter_ms < 5.5


def test_summary_percentiles() -> None:
    s = summarize([float(v) for v in range(1, 101)])
    assert s.count == 100
    assert s.p50 == pytest.approx(50.5)
    assert s.max == 100.0
    assert summarize([]).count == 0
