"""The collector paced by the media clock (docs/adr/0010-collector-paced-by-the-tick.md)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gateway.heap import CollectorPolicy, PacedCollector, due_generation

POLICY = CollectorPolicy(thresholds=(700, 10, 10), full_interval_s=120.0, defer_limit=20)


@pytest.mark.parametrize(
    ("counts", "idle", "late", "since_full_s", "expected"),
    [
        ((700, 0, 0), False, False, 0.0, None),  # each count must pass its threshold, as in CPython
        ((701, 0, 0), False, False, 0.0, 0),
        ((701, 10, 0), False, False, 0.0, 0),
        ((701, 11, 0), False, False, 0.0, 1),
        ((701, 11, 11), False, False, 119.0, 1),  # a full pass is due, but calls are live and one ran lately
        ((701, 11, 11), False, False, 120.0, 2),  # ... until the interval has passed
        ((701, 11, 11), True, False, 1.0, 2),  # with no call live, as soon as it is due
        ((701, 11, 10), True, False, 999.0, 1),  # the interval alone does not make a full pass due
        ((5_000, 11, 11), False, True, 999.0, None),  # the tick ended late: wait for the next one
        ((14_001, 0, 0), False, True, 0.0, 0),  # ... unless 20 thresholds' worth has piled up
    ],
)
def test_due_generation_follows_cpythons_thresholds_and_paces_full_passes(
    counts: tuple[int, int, int], idle: bool, late: bool, since_full_s: float, expected: int | None
) -> None:
    assert due_generation(counts, POLICY, idle=idle, late=late, since_full_s=since_full_s) == expected


@pytest.mark.parametrize(
    "kwargs",
    [{"thresholds": (0, 10, 10)}, {"full_interval_s": 0.0}, {"defer_limit": 0}],
)
def test_a_policy_that_would_never_or_always_collect_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        CollectorPolicy(**kwargs)  # type: ignore[arg-type]


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def make_cycles(n: int) -> None:
    for _ in range(n):
        a, b = Node(), Node()
        a.other, b.other = b, a


def alive_nodes() -> int:
    return sum(1 for obj in gc.get_objects() if type(obj) is Node)


@pytest.fixture
def clean_heap() -> Iterator[None]:
    assert gc.isenabled()
    gc.collect()
    yield
    gc.enable()
    gc.collect()


def test_the_automatic_collector_is_off_while_open_and_passes_run_after_ticks(clean_heap: None) -> None:
    seen: list[tuple[int, bool]] = []
    collector = PacedCollector(POLICY, observe=lambda gen, seconds, paced: seen.append((gen, paced)))
    collector.open()
    try:
        assert not gc.isenabled()
        make_cycles(5_000)  # 10,000 tracked objects: CPython would have collected them many times over
        assert alive_nodes() == 10_000
        assert collector.after_tick(idle=False, late=True) is None  # far under the defer limit: waits
        generations = []
        while alive_nodes():
            generation = collector.after_tick(idle=False, late=False)
            assert generation is not None, "a pass was due while cyclic garbage was left"
            generations.append(generation)
        assert generations[0] == 0
        assert seen and all(paced for _, paced in seen)
        assert collector.passes[0] >= 1
    finally:
        collector.close()
    assert gc.isenabled()


def test_collectors_share_the_switch_and_the_last_to_close_restores_it(clean_heap: None) -> None:
    first, second = PacedCollector(POLICY), PacedCollector(POLICY)
    first.open()
    second.open()
    first.close()
    assert not gc.isenabled(), "one collector still open: the automatic collector stays off"
    second.close()
    assert gc.isenabled()
    gc.disable()  # opened with the collector already off: closing leaves it off
    try:
        first.open()
        first.close()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_held_collector_runs_no_pass_and_a_closed_one_none_either(clean_heap: None) -> None:
    collector = PacedCollector(POLICY)
    collector.open()
    try:
        make_cycles(1_000)
        with collector.held():
            assert collector.after_tick(idle=True, late=False) is None
            assert alive_nodes() == 2_000
        assert collector.after_tick(idle=True, late=False) is not None
    finally:
        collector.close()
    assert collector.after_tick(idle=True, late=False) is None


def test_a_full_pass_while_calls_are_live_waits_for_its_interval(clean_heap: None) -> None:
    now = [1_000.0]
    policy = CollectorPolicy(thresholds=(1, 1, 1), full_interval_s=60.0)
    collector = PacedCollector(policy, monotonic=lambda: now[0])
    collector.open()
    try:
        generations = []
        for _ in range(6):
            make_cycles(10)
            generations.append(collector.after_tick(idle=False, late=False))
        assert 2 not in generations
        now[0] += 60.0
        make_cycles(10)
        while (generation := collector.after_tick(idle=False, late=False)) != 2:
            assert generation is not None
            make_cycles(10)
        assert collector.passes[2] == 1
    finally:
        collector.close()
