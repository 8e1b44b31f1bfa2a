"""`Slices`: the loop is let in once a slice has run its length, and not before."""

from __future__ import annotations

import asyncio

from gateway.slices import Slices


class LoopTurns:
    """Counts the loop's turns: a callback that re-queues itself until stopped."""

    def __init__(self) -> None:
        self.turns = 0
        self.running = True
        asyncio.get_running_loop().call_soon(self._turn)

    def _turn(self) -> None:
        if self.running:
            self.turns += 1
            asyncio.get_running_loop().call_soon(self._turn)


async def test_a_zero_slice_lets_the_loop_in_at_every_item() -> None:
    turns = LoopTurns()
    await asyncio.sleep(0)
    before = turns.turns
    slices = Slices(0.0)
    for _ in range(5):
        await slices.next()
    turns.running = False
    assert slices.yields == 5 and turns.turns - before >= 5


async def test_a_long_slice_keeps_the_loop_out_until_it_has_run() -> None:
    turns = LoopTurns()
    await asyncio.sleep(0)
    before = turns.turns
    slices = Slices(3600.0)
    for _ in range(1000):
        await slices.next()
    turns.running = False
    assert slices.yields == 0 and turns.turns == before
