"""Task helpers of the pipeline session: awaiting what was cancelled, resampling."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any

import numpy as np

from telcodecs.resample import StreamResampler

log = logging.getLogger(__name__)


class Resampler:
    """24 kHz caller frames to a component's rate (whole 20 ms frames; pass-through at 24 kHz)."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._stream = None if rate == 24_000 else StreamResampler(24_000, rate)
        self._carry = b""

    def process(self, pcm: bytes) -> bytes:
        if self._stream is None:
            return pcm
        data = self._carry + pcm
        step = 2 * self._stream.in_frame
        whole = len(data) - len(data) % step
        self._carry = data[whole:]
        samples = np.frombuffer(data[:whole], dtype="<i2")
        out = [self._stream.process(samples[i : i + self._stream.in_frame]) for i in range(0, samples.size, step // 2)]
        return b"".join(frame.tobytes() for frame in out)


async def quietly(awaitable: Awaitable[None]) -> None:
    with contextlib.suppress(Exception):
        await awaitable


async def wait_cancelled(task: asyncio.Task[Any]) -> None:
    """Await a task we cancelled; re-raise only our own cancellation."""
    if task is asyncio.current_task():
        return
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
    except Exception:
        log.debug("task %s ended with an error after cancel", task.get_name(), exc_info=True)
