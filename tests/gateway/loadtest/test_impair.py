"""Network impairment of what load callers send: seeded loss, jitter and bursts, and their effect on a run."""

from __future__ import annotations

import itertools
import random

import pytest

from gateway.loadtest.config import ImpairConfig, LoadConfigError
from gateway.loadtest.impair import CallImpairment
from tests.gateway.loadtest.test_runner import _run


def fates(config: ImpairConfig, frames: int, seed: int = 3) -> list[float | None]:
    impairment = CallImpairment(config, random.Random(seed))
    return [impairment.delay_s(k) for k in range(frames)]


@pytest.mark.parametrize(
    "bad",
    [
        {"loss_pct": -1},
        {"loss_pct": 101},
        {"loss_pct": float("nan")},
        {"jitter_ms": 1001},
        {"burst_ms": 30, "burst_every_s": 1.0},  # not whole frames
        {"burst_ms": 100},  # no period
        {"burst_ms": 1000, "burst_every_s": 1.0},  # a burst as long as its period
    ],
)
def test_settings_that_cannot_mean_anything_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(LoadConfigError):
        ImpairConfig(**bad)  # type: ignore[arg-type]


def test_no_impairment_sends_everything_at_once() -> None:
    assert not ImpairConfig().active
    assert fates(ImpairConfig(), 100) == [0.0] * 100


def test_loss_is_the_asked_fraction_and_the_same_for_the_same_seed() -> None:
    config = ImpairConfig(loss_pct=10.0)
    first = fates(config, 5000)
    assert 0.08 < first.count(None) / 5000 < 0.12
    assert fates(config, 5000) == first and fates(config, 5000, seed=4) != first


def test_jitter_holds_each_packet_up_to_its_bound_and_lets_some_overtake() -> None:
    delays = fates(ImpairConfig(jitter_ms=50), 2000)
    assert all(d is not None and 0.0 <= d <= 0.05 for d in delays)
    leave = [k * 0.02 + d for k, d in enumerate(delays) if d is not None]
    assert any(b < a for a, b in itertools.pairwise(leave))  # reordered, as on a real network


def test_a_burst_holds_a_calls_packets_and_releases_them_with_the_next_one_on_time() -> None:
    delays = fates(ImpairConfig(burst_ms=100, burst_every_s=1.0), 250)
    held = [k for k, d in enumerate(delays) if d]
    assert len(held) == 5 * 5  # five frames in each of five one-second periods
    leave = [round((k * 0.02 + (delays[k] or 0.0)) * 1000) for k in range(250)]
    for start in held[::5]:
        burst = list(range(start, start + 5))
        assert burst == held[held.index(start) : held.index(start) + 5]
        assert {leave[k] for k in burst} == {leave[start + 5]}  # all five leave with the first frame after


async def test_impaired_callers_are_reported_and_the_target_sees_the_impairment() -> None:
    lossy = await _run(calls=2, impair=ImpairConfig(loss_pct=10.0))
    generator = lossy["generator"]
    assert generator["impair"] == "loss 10 %" and generator["impair_dropped"] > 0
    # the peer reflects what it got: a dropped packet never comes back (the peer numbers its own packets)
    assert lossy["packets_received"] <= lossy["packets_sent"] - generator["impair_dropped"]
    assert lossy["packets_received"] >= lossy["packets_sent"] - generator["impair_dropped"] - 2 * 10

    bursty = await _run(calls=2, impair=ImpairConfig(burst_ms=100, burst_every_s=1.0))
    assert bursty["generator"]["impair_delayed"] >= 2 * 2 * 5 and bursty["generator"]["impair_dropped"] == 0
    # the reflection keeps each packet's timestamp: a held packet comes back as late as it was held
    assert bursty["pacing_error_ms"]["p99"] >= 60
    assert bursty["packets_lost"] == 0
