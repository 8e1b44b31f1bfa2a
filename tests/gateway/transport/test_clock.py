import asyncio
import itertools

from gateway.transport.clock import MediaClock


async def test_ticks_land_on_absolute_deadlines_without_drift() -> None:
    loop = asyncio.get_running_loop()
    deadlines: list[float] = []
    done = asyncio.Event()

    def on_tick(deadline: float) -> None:
        deadlines.append(deadline)
        # work that would make a sleep(0.02) loop drift by 3 ms per tick
        end = loop.time() + 0.003
        while loop.time() < end:
            pass
        if len(deadlines) == 25:
            done.set()

    clock = MediaClock(on_tick, period=0.02)
    clock.start()
    try:
        await asyncio.wait_for(done.wait(), timeout=5)
    finally:
        clock.stop()
    steps = [b - a for a, b in itertools.pairwise(deadlines)]
    assert all(abs(s - 0.02) < 1e-9 for s in steps)
    assert clock.stats.ticks >= 25


async def test_a_stalled_loop_catches_up_missed_ticks() -> None:
    loop = asyncio.get_running_loop()
    deadlines: list[float] = []
    done = asyncio.Event()

    def on_tick(deadline: float) -> None:
        deadlines.append(deadline)
        if len(deadlines) == 2:
            end = loop.time() + 0.07  # stall for 3.5 periods
            while loop.time() < end:
                pass
        if len(deadlines) == 10:
            done.set()

    clock = MediaClock(on_tick, period=0.02, max_catch_up=10)
    clock.start()
    try:
        await asyncio.wait_for(done.wait(), timeout=5)
    finally:
        clock.stop()
    # every media-time slot got its tick: consecutive deadlines, none skipped
    assert [round((d - deadlines[0]) / 0.02) for d in deadlines[:10]] == list(range(10))
    assert clock.stats.overruns >= 1
    assert clock.stats.skipped == 0
