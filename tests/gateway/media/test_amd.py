"""Answering-machine detection's rules on constructed signals: each rule decides what it says, tones are never
words, a machine's beep is found where it starts, and nothing more is reported once the call is decided."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from gateway.media.amd import AmdConfig, AmdDecided, AmdResult, AnsweringMachineDetector, BeepHeard

RATE = 24_000
FRAME = RATE // 50


def tone(hz: float, seconds: float, dbfs: float = -15.0) -> npt.NDArray[np.float64]:
    t = np.arange(int(RATE * seconds)) / RATE
    return np.sin(2 * np.pi * hz * t) * 32768 * 10 ** ((dbfs + 3) / 20)


def babble(seconds: float, *, seed: int = 1) -> npt.NDArray[np.float64]:
    """Voiced, broadband and not one steady tone: pulses at a moving pitch through noise (speech enough)."""
    rng = np.random.default_rng(seed)
    n = int(RATE * seconds)
    t = np.arange(n) / RATE
    pitch = 120 + 40 * np.sin(2 * np.pi * 3 * t)
    pulses = (np.diff(np.floor(np.cumsum(pitch / RATE)), prepend=0.0) > 0).astype(float)
    x = np.convolve(pulses, np.hanning(60), mode="same") + 0.3 * rng.standard_normal(n)
    return x / np.sqrt(np.mean(x * x)) * 32768 * 10 ** (-18 / 20)


def silence(seconds: float) -> npt.NDArray[np.float64]:
    return np.zeros(int(RATE * seconds))


def words(count: int, *, word_s: float = 0.3, gap_s: float = 0.15) -> npt.NDArray[np.float64]:
    parts = []
    for i in range(count):
        parts += [babble(word_s, seed=i), silence(gap_s)]
    return np.concatenate(parts)


def run(signal: npt.NDArray[np.float64], config: AmdConfig | None = None) -> tuple[AnsweringMachineDetector, list]:
    pcm = np.clip(np.round(signal), -32768, 32767).astype(np.int16)
    detector = AnsweringMachineDetector(config, sample_rate=RATE)
    events = []
    for start in range(0, pcm.size - FRAME + 1, FRAME):
        events += detector.feed(pcm[start : start + FRAME])
    return detector, events


def decided(events: list) -> AmdDecided:
    (decision,) = [e for e in events if isinstance(e, AmdDecided)]
    return decision


def test_hello_then_silence_is_a_human() -> None:
    _, events = run(np.concatenate([silence(0.3), words(1, word_s=0.5), silence(2.0)]))
    decision = decided(events)
    assert (decision.result, decision.reason) == (AmdResult.HUMAN, "short_greeting")
    assert decision.at_s == pytest.approx(0.3 + 0.5 + 0.8, abs=0.05)  # speech ends, then 0.8 s
    assert not [e for e in events if isinstance(e, BeepHeard)]


def test_long_greeting_is_a_machine_and_its_beep_is_found() -> None:
    signal = np.concatenate([babble(3.0), silence(0.4), tone(1000, 0.5), silence(1.0)])
    detector, events = run(signal)
    assert (decided(events).result, decided(events).reason) == (AmdResult.MACHINE, "long_greeting")
    (beep,) = [e for e in events if isinstance(e, BeepHeard)]
    assert beep.frequency_hz == pytest.approx(1000, abs=50)
    assert beep.at_s == pytest.approx(3.4, abs=0.03)
    assert detector.feed(np.zeros(FRAME, dtype=np.int16)) == []


def test_many_short_words_are_a_machine() -> None:
    _, events = run(np.concatenate([words(4, word_s=0.2, gap_s=0.1), silence(2)]))
    assert (decided(events).result, decided(events).reason) == (AmdResult.MACHINE, "many_words")


def test_silence_first_is_a_machine_by_the_baseline_rule() -> None:
    _, events = run(silence(3.0))
    assert (decided(events).result, decided(events).reason) == (AmdResult.MACHINE, "initial_silence")
    assert decided(events).at_s == pytest.approx(2.5, abs=0.03)


def test_a_beep_before_any_decision_decides_machine_at_once() -> None:
    _, events = run(np.concatenate([silence(0.2), tone(800, 0.4), silence(3)]))
    decision = decided(events)
    assert (decision.result, decision.reason) == (AmdResult.MACHINE, "beep")
    assert decision.words == 0  # the tone never counted as speech


def test_cng_is_a_fax() -> None:
    _, events = run(np.concatenate([tone(1100, 0.5), silence(3.0), tone(1100, 0.5)]))
    assert (decided(events).result, decided(events).reason) == (AmdResult.FAX, "fax_tone")


def test_no_rule_within_the_analysis_time_is_unknown() -> None:
    config = AmdConfig(total_s=1.0, greeting_s=5.0, max_words=50, after_greeting_silence_s=2.0)
    _, events = run(np.concatenate([words(2), babble(2.0)]), config)
    assert (decided(events).result, decided(events).reason) == (AmdResult.UNKNOWN, "timeout")


def test_machine_without_a_beep_ends_the_wait_when_the_greeting_stops() -> None:
    _, events = run(np.concatenate([babble(2.5), silence(2.0)]))
    (end,) = [e for e in events if isinstance(e, BeepHeard)]
    assert end.frequency_hz is None and end.at_s == pytest.approx(2.5 + 1.6, abs=0.05)


def test_beep_wait_is_bounded() -> None:
    config = AmdConfig(beep_wait_s=1.0)
    _, events = run(babble(5.0), config)
    (end,) = [e for e in events if isinstance(e, BeepHeard)]
    assert end.frequency_hz is None and end.at_s == pytest.approx(1.5 + 1.0, abs=0.05)


@pytest.mark.parametrize("bad", [{"greeting_s": 0}, {"max_words": 0}, {"beep_min_s": -1}])
def test_bad_config_is_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        AmdConfig(**bad)  # type: ignore[arg-type]


def test_low_rates_are_refused() -> None:
    with pytest.raises(ValueError):
        AnsweringMachineDetector(sample_rate=4000)
