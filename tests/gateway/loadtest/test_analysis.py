import numpy as np
import pytest

from gateway.loadtest.analysis import chirp, echo_correlation, find_marker, summarize


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


def test_summary_percentiles() -> None:
    s = summarize([float(v) for v in range(1, 101)])
    assert s.count == 100
    assert s.p50 == pytest.approx(50.5)
    assert s.max == 100.0
    assert summarize([]).count == 0
