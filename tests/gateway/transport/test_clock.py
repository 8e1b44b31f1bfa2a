import asyncio
import itertools
import socket
from collections.abc import Callable

import pytest
import uvloop

from gateway.transport.clock import MediaClock


def busy(loop: asyncio.AbstractEventLoop, seconds: float) -> None:
    """Keep the event loop busy (work in a tick, or a stall) for ``seconds``."""
    end = loop.time() + seconds
    while loop.time() < end:
        pass


async def run_until(clock: MediaClock, done: asyncio.Event) -> None:
    """Run ``clock`` until ``done`` is set (5 s at most), then stop it."""
    clock.start()
    try:
        await asyncio.wait_for(done.wait(), timeout=5)
    finally:
        clock.stop()


async def test_ticks_land_on_absolute_deadlines_without_drift() -> None:
    loop = asyncio.get_running_loop()
    deadlines: list[float] = []
    done = asyncio.Event()

    def on_tick(deadline: float) -> None:
        deadlines.append(deadline)
        # work that would make a sleep(0.02) loop drift by 3 ms per tick
        busy(loop, 0.003)
        if len(deadlines) == 25:
            done.set()

    clock = MediaClock(on_tick, period=0.02)
    await run_until(clock, done)
    steps = [b - a for a, b in itertools.pairwise(deadlines)]
    assert all(abs(s - 0.02) < 1e-9 for s in steps)
    assert clock.stats.ticks >= 25


def stall_at_second_tick(stall_s: float, ticks: int) -> tuple[Callable[[float], None], list[float], asyncio.Event]:
    """An on_tick that records deadlines, stalls the loop ``stall_s`` in the second tick, and sets the event
    once ``ticks`` have run."""
    loop = asyncio.get_running_loop()
    deadlines: list[float] = []
    done = asyncio.Event()

    def on_tick(deadline: float) -> None:
        deadlines.append(deadline)
        if len(deadlines) == 2:
            busy(loop, stall_s)
        if len(deadlines) == ticks:
            done.set()

    return on_tick, deadlines, done


async def test_a_stalled_loop_catches_up_missed_ticks() -> None:
    on_tick, deadlines, done = stall_at_second_tick(0.07, 10)  # 3.5 periods
    clock = MediaClock(on_tick, period=0.02, max_catch_up=10)
    await run_until(clock, done)
    # every media-time slot got its tick: consecutive deadlines, none skipped
    assert [round((d - deadlines[0]) / 0.02) for d in deadlines[:10]] == list(range(10))
    assert clock.stats.overruns >= 1
    assert clock.stats.skipped == 0


async def test_a_stall_past_the_catch_up_limit_skips_ticks_and_says_how_many() -> None:
    on_tick, deadlines, done = stall_at_second_tick(0.15, 8)  # 7.5 periods; two catch-up ticks allowed
    skipped: list[int] = []
    clock = MediaClock(on_tick, period=0.02, max_catch_up=2, on_skipped=skipped.append)
    await run_until(clock, done)
    slots = [round((d - deadlines[0]) / 0.02) for d in deadlines]
    gaps = [b - a - 1 for a, b in itertools.pairwise(slots)]
    assert sum(skipped) == clock.stats.skipped == sum(gaps) > 0
    assert all(n > 0 for n in skipped)


async def test_a_failing_callback_never_stops_the_clock(caplog: pytest.LogCaptureFixture) -> None:
    on_tick, ticks, done = stall_at_second_tick(0.1, 6)  # past the one catch-up tick allowed: the clock skips

    def broken(*args: object) -> None:
        raise RuntimeError("bug")

    clock = MediaClock(on_tick, period=0.02, max_catch_up=1, on_measured=broken, on_skipped=broken)
    await run_until(clock, done)
    assert len(ticks) >= 6 and clock.stats.skipped > 0
    assert "media tick measurement failed" in caplog.text and "handling skipped media ticks failed" in caplog.text


def _catch_up_order(loop_factory: Callable[[], asyncio.AbstractEventLoop]) -> list[str]:
    """Tick 2 stalls for 3.5 periods after a datagram arrived and after it woke a callback; the order of what ran."""

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        events: list[str] = []
        done = asyncio.Event()
        receiver, sender = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        receiver.setblocking(False)

        def readable() -> None:
            while True:
                try:
                    receiver.recv(64)
                except BlockingIOError:
                    return
                events.append("read")

        def on_tick(deadline: float) -> None:
            ticks = sum(e == "tick" for e in events)
            events.append("tick")
            if ticks == 1:
                loop.call_soon(events.append, "woken")  # e.g. a session task the tick's frame woke
                sender.send(b"rtp")  # a packet that arrives during the stall
                busy(loop, 0.07)
            if ticks == 6:
                done.set()

        loop.add_reader(receiver.fileno(), readable)
        clock = MediaClock(on_tick, period=0.02, max_catch_up=10)
        try:
            await run_until(clock, done)
        finally:
            loop.remove_reader(receiver.fileno())
            receiver.close()
            sender.close()
        assert clock.stats.overruns >= 1 and clock.stats.skipped == 0
        return events

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main())


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_catch_up_ticks_let_the_loop_read_sockets_and_run_woken_callbacks_first(
    loop_factory: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    events = _catch_up_order(loop_factory)
    stalled = events.index("tick", events.index("tick") + 1)  # the second tick
    catch_up = events.index("tick", stalled + 1)
    assert {"read", "woken"} <= set(events[stalled + 1 : catch_up])
