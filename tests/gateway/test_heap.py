"""Full collector passes paced by the media clock (docs/adr/0010-full-collections-paced-by-the-tick.md)."""

from __future__ import annotations

import gc
import itertools
import weakref
from collections.abc import Iterator

import pytest

from gateway.heap import CollectorPolicy, PacedCollector, full_pass_due

POLICY = CollectorPolicy(full_after=10, full_interval_s=120.0)


@pytest.mark.parametrize(
    ("middle_passes", "idle", "late", "since_full_s", "expected"),
    [
        (10, True, False, 999.0, False),  # CPython's count must pass its threshold
        (11, True, False, 0.0, True),  # no call live: as soon as it is due
        (11, False, False, 119.0, False),  # calls live and a full pass ran lately: wait
        (11, False, False, 120.0, True),  # ... until the interval has passed
        (11, True, True, 999.0, False),  # the tick ended late: never hold back the ticks catching up
    ],
)
def test_a_full_pass_is_due_by_cpythons_count_then_by_idleness_or_the_interval(
    middle_passes: int, idle: bool, late: bool, since_full_s: float, expected: bool
) -> None:
    assert full_pass_due(middle_passes, POLICY, idle=idle, late=late, since_full_s=since_full_s) is expected


@pytest.mark.parametrize("kwargs", [{"full_after": -1}, {"full_interval_s": 0.0}, {"middle_after": 0}])
def test_a_policy_out_of_range_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        CollectorPolicy(**kwargs)  # type: ignore[arg-type]


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def old_cyclic_garbage() -> weakref.ref[Node]:
    """A cycle that reached the oldest generation while alive, then lost its last outside reference."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    gc.collect(1)  # alive: moved on to generation 2, which only a full pass examines
    probe = weakref.ref(a)
    del a, b
    gc.collect(1)
    assert probe() is not None
    return probe


def bump_middle_passes(n: int) -> None:
    for _ in range(n):
        gc.collect(1)


@pytest.fixture
def clean_heap() -> Iterator[None]:
    thresholds = gc.get_threshold()
    gc.collect()
    yield
    gc.set_threshold(*thresholds)
    gc.collect()


def test_cpython_runs_no_full_pass_while_open_and_the_collector_runs_it_after_a_tick(clean_heap: None) -> None:
    seen: list[tuple[int, bool]] = []
    collector = PacedCollector(POLICY, observe=lambda gen, seconds, paced: seen.append((gen, paced)))
    young, middle, full = gc.get_threshold()
    collector.open()
    try:
        assert gc.get_threshold()[:2] == (young, middle) and gc.get_threshold()[2] > 1_000_000
        probe = old_cyclic_garbage()
        for _ in range(60):  # 120,000 objects in cycles: CPython's young passes run, no full one
            for _ in range(1_000):
                a, b = Node(), Node()
                a.other, b.other = b, a
            del a, b
        assert probe() is not None
        assert gc.get_count()[2] > POLICY.full_after
        assert any(gen == 1 and not paced for gen, paced in seen)
        assert all(gen < 2 for gen, _ in seen)
        assert collector.after_tick(idle=False, late=False) is False  # calls live, interval not passed
        assert collector.after_tick(idle=True, late=False) is True
        assert probe() is None
        assert (2, True) in seen
        assert collector.full_passes == 1
    finally:
        collector.close()
    assert gc.get_threshold() == (young, middle, full)


def test_a_policys_middle_after_sets_how_many_young_passes_come_before_a_middle_one(clean_heap: None) -> None:
    seen: list[int] = []
    policy = CollectorPolicy(full_after=10, full_interval_s=120.0, middle_after=2)
    collector = PacedCollector(policy, observe=lambda gen, seconds, paced: seen.append(gen))
    before = gc.get_threshold()
    collector.open()
    try:
        assert gc.get_threshold()[:2] == (before[0], 2)
        for _ in range(40):  # 80,000 objects in cycles: CPython's passes, as the thresholds say
            for _ in range(1_000):
                a, b = Node(), Node()
                a.other, b.other = b, a
            del a, b
    finally:
        collector.close()
    assert gc.get_threshold() == before
    middles = [i for i, gen in enumerate(seen) if gen == 1]
    assert len(middles) >= 5, seen
    # CPython runs a middle pass once its count of young passes exceeds the threshold: three young, then a middle.
    assert {later - earlier for earlier, later in itertools.pairwise(middles)} == {4}, seen


def test_collectors_share_the_switch_and_the_last_to_close_restores_the_thresholds(clean_heap: None) -> None:
    before = gc.get_threshold()
    first, second = PacedCollector(POLICY), PacedCollector(POLICY)
    first.open()
    second.open()
    first.close()
    assert gc.get_threshold() != before, "one collector still open: CPython's full passes stay off"
    second.close()
    assert gc.get_threshold() == before


def test_a_held_or_closed_collector_runs_no_pass_nor_one_with_the_collector_disabled(clean_heap: None) -> None:
    collector = PacedCollector(POLICY)
    collector.open()
    try:
        probe = old_cyclic_garbage()
        bump_middle_passes(POLICY.full_after + 1)
        with collector.held():
            assert collector.after_tick(idle=True, late=False) is False
        gc.disable()  # a test that counts on reference counting alone turns the collector off
        try:
            assert collector.after_tick(idle=True, late=False) is False
        finally:
            gc.enable()
        assert probe() is not None
        assert collector.after_tick(idle=True, late=False) is True
        assert probe() is None
    finally:
        collector.close()
    bump_middle_passes(POLICY.full_after + 1)
    assert collector.after_tick(idle=True, late=False) is False


def test_a_full_pass_while_calls_are_live_waits_for_its_interval(clean_heap: None) -> None:
    now = [1_000.0]
    collector = PacedCollector(CollectorPolicy(full_after=1, full_interval_s=60.0), monotonic=lambda: now[0])
    collector.open()
    try:
        bump_middle_passes(2)
        assert collector.after_tick(idle=False, late=False) is False
        now[0] += 59.0
        assert collector.after_tick(idle=False, late=False) is False
        now[0] += 1.0
        assert collector.after_tick(idle=False, late=False) is True
        bump_middle_passes(2)
        assert collector.after_tick(idle=False, late=False) is False, "the interval counts from the last pass"
    finally:
        collector.close()
