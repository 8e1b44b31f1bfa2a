"""`exposition`: the bytes of `generate_latest`, rendered with the event loop let in between families."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.observability import REGISTRY, TICK_SECONDS, exposition
from tests.support.loop_turns import LoopTurns


def _registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=True)
    calls = Counter("calls_total", 'Calls, by "reason"\nand worker', ["worker", "reason"], registry=registry)
    tick = Histogram("tick_seconds", "Tick", ["worker"], buckets=(0.01, 0.02), registry=registry)
    up = Gauge("up_calls", "Calls up", registry=registry)
    calls.labels("w1", 'bye "now"\\').inc(3)
    calls.labels("w2", "timeout").inc()
    for seconds in (0.005, 0.015, 0.5):
        tick.labels("w1").observe(seconds)
    up.set(7)
    return registry


async def test_it_renders_the_bytes_generate_latest_renders() -> None:
    registry = _registry()
    assert await exposition(registry) == generate_latest(registry)
    assert await exposition(registry, slice_s=0.0) == generate_latest(registry)
    TICK_SECONDS.labels("test-observability").observe(0.013)
    assert await exposition(REGISTRY) == generate_latest(REGISTRY)


async def test_the_loop_runs_between_families_and_not_inside_generate_latest() -> None:
    registry = _registry()
    families = len(list(registry.collect()))
    assert families == 3

    probe = LoopTurns()
    await asyncio.sleep(0)  # the probe's first turn
    before = probe.turns
    generate_latest(registry)
    assert probe.turns == before  # one stretch: nothing else ran

    before = probe.turns
    await exposition(registry, slice_s=0.0)  # let the loop in after every family
    probe.running = False
    assert probe.turns - before >= families
