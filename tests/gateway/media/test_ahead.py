"""When Opus calls are encoded a tick ahead: the mean of each window of ticks against the budget, hysteresis."""

from __future__ import annotations

import pytest

from gateway.media.ahead import WINDOW_TICKS, OpusAheadPolicy
from gateway.media.errors import LocalMediaError


def feed(policy: OpusAheadPolicy, seconds: float, ticks: int = WINDOW_TICKS) -> list[bool]:
    return [policy.observed(seconds) for _ in range(ticks)]


def test_ahead_once_a_windows_mean_is_over_the_budget_and_back_below_half_of_it() -> None:
    policy = OpusAheadPolicy(0.002)
    assert not any(feed(policy, 0.0019))  # under the budget: inline
    decisions = feed(policy, 0.0025)
    assert decisions == [False] * (WINDOW_TICKS - 1) + [True]  # decided at the window's end, not before
    assert all(feed(policy, 0.0011, 3 * WINDOW_TICKS))  # between half and the budget: stays ahead
    assert feed(policy, 0.0009)[-1] is False
    assert policy.changes == 2


def test_one_slow_tick_in_a_window_does_not_move_the_decision() -> None:
    policy = OpusAheadPolicy(0.002)
    decisions = [policy.observed(0.030 if k == 10 else 0.0012) for k in range(WINDOW_TICKS)]
    assert not any(decisions)  # a 30 ms collector pass adds 0.6 ms to a 1.2 ms mean


def test_a_budget_of_zero_is_always_ahead_and_a_negative_one_is_refused() -> None:
    policy = OpusAheadPolicy(0.0)
    assert policy.ahead and all(feed(policy, 0.0, 2 * WINDOW_TICKS)) and policy.changes == 0
    with pytest.raises(LocalMediaError, match="budget"):
        OpusAheadPolicy(-0.001)
    with pytest.raises(LocalMediaError, match="window"):
        OpusAheadPolicy(0.002, window=0)
