"""When Opus calls are encoded a tick ahead: each window's 90th percentile against the budget, a calm to come back."""

from __future__ import annotations

import pytest

from gateway.media.ahead import CALM_WINDOWS, WINDOW_TICKS, OpusAheadPolicy
from gateway.media.errors import LocalMediaError


def window(policy: OpusAheadPolicy, busy: float, *, busy_ticks: int, quiet: float = 0.0002) -> list[bool]:
    """One window of ticks: ``busy_ticks`` of them take ``busy`` seconds (many agents talking), the rest ``quiet``."""
    return [policy.observed(busy if k % (WINDOW_TICKS // busy_ticks) == 0 else quiet) for k in range(WINDOW_TICKS)]


def test_ahead_once_a_tenth_of_a_windows_ticks_are_over_the_budget() -> None:
    policy = OpusAheadPolicy(0.002)
    assert not any(window(policy, 0.004, busy_ticks=3))  # 4 busy ticks of 50: under the 90th percentile
    decisions = window(policy, 0.004, busy_ticks=10)  # the mean, 0.96 ms, is under the budget; the p90 is not
    assert decisions == [False] * (WINDOW_TICKS - 1) + [True]  # decided at the window's end, not before
    assert policy.last_p90 == 0.004 and policy.changes == 1


def test_back_inline_only_after_a_calm_of_several_windows() -> None:
    policy = OpusAheadPolicy(0.002)
    window(policy, 0.003, busy_ticks=25)
    assert policy.ahead
    for _ in range(CALM_WINDOWS - 1):
        assert all(window(policy, 0.0009, busy_ticks=25))  # under half the budget, not yet long enough
    assert all(window(policy, 0.0015, busy_ticks=25))  # between half and the budget: the calm starts over
    for _ in range(CALM_WINDOWS - 1):
        assert all(window(policy, 0.0009, busy_ticks=25))
    assert window(policy, 0.0009, busy_ticks=25)[-1] is False
    assert policy.changes == 2


def test_a_budget_of_zero_is_always_ahead_one_of_a_tick_never_and_bad_ones_are_refused() -> None:
    policy = OpusAheadPolicy(0.0)
    assert policy.ahead
    for _ in range(2 * CALM_WINDOWS):
        assert all(window(policy, 0.0, busy_ticks=1))
    assert policy.changes == 0
    never = OpusAheadPolicy(0.020)
    assert not any(window(never, 0.045, busy_ticks=50)) and not never.ahead  # even encodes over a tick
    with pytest.raises(LocalMediaError, match="budget"):
        OpusAheadPolicy(-0.001)
    with pytest.raises(LocalMediaError, match="window"):
        OpusAheadPolicy(0.002, window=5)
    with pytest.raises(LocalMediaError, match="calm"):
        OpusAheadPolicy(0.002, calm_windows=0)
