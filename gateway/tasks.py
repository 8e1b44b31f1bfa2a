"""Owned background tasks: a named set that logs failures and is cancelled and awaited as one.

Every long-lived object that starts tasks (the SIP transport, the worker, its browser calls) owns one
:class:`TaskSet`, so no task outlives its owner and no exception vanishes unlogged. (The session core has a
richer owner of its own, :mod:`gateway.session.tasks`, that routes failures into the call.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class TaskSet:
    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self.adopt(task)
        return task

    def adopt(self, task: asyncio.Task[Any]) -> None:
        """Own a task started elsewhere (e.g. asyncio.start_server's connection handlers)."""
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s task %s failed", self.owner, task.get_name(), exc_info=task.exception())

    async def aclose(self) -> None:
        """Cancel every task and wait for all of them to finish."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
