"""Counting the event loop's turns while a coroutine runs: did it let the loop in, and how often."""

from __future__ import annotations

import asyncio


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
