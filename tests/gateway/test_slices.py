"""`Slices`: the loop is let in once a slice has run its length, and not before."""

from __future__ import annotations

import asyncio

from gateway.slices import Slices
from tests.support.loop_turns import LoopTurns


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
