"""Task and timer ownership for one call: every task named and kept in one set, every timer tracked.

Exceptions of guarded tasks are reported to the owner (never lost); a critical task's failure also asks the owner
to end the call. Once closing, nothing new starts. :meth:`TaskOwner.cancel_all` cancels and awaits, bounded.
:meth:`TaskOwner.wait_until` is how session code waits for its own state (woken by :meth:`TaskOwner.pulse`).
"""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any


def _ignore() -> None:
    pass


def _ignore_error(where: str, exc: BaseException) -> None:
    pass


class TaskOwner:
    def __init__(
        self,
        *,
        prefix: str,
        on_error: Callable[[str, BaseException], None],
        on_critical: Callable[[], None],
    ) -> None:
        self._prefix = prefix
        self._on_error = on_error
        self._on_critical = on_critical
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._changed: asyncio.Event | None = None
        self.closing = False

    @property
    def tasks(self) -> frozenset[asyncio.Task[Any]]:
        return frozenset(self._tasks)

    def spawn(
        self, coro: Coroutine[Any, Any, Any], *, name: str, critical: bool = False, guard: bool = True
    ) -> asyncio.Task[Any] | None:
        """Start an owned task; refused (the coroutine is closed, None returned) once closing.

        Unguarded tasks keep their result/exception for whoever awaits them.
        """
        if self.closing:
            coro.close()
            return None
        task = asyncio.get_running_loop().create_task(
            self._guard(coro, name, critical) if guard else coro, name=f"{self._prefix}:{name}"
        )
        self._tasks.add(task)
        task.add_done_callback(partial(self._done, coro))
        return task

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle | None:
        if self.closing:
            return None

        def fire() -> None:
            self._timers.discard(handle)
            try:
                callback()
            except Exception as exc:
                self._on_error("timer", exc)

        handle = asyncio.get_running_loop().call_later(delay, fire)
        self._timers.add(handle)
        return handle

    async def cancel_all(self, *, timeout_s: float) -> list[str]:
        """Stop timers, cancel every task but the caller and await them; returns names that did not stop."""
        self.closing = True
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        current = asyncio.current_task()
        while True:
            tasks = [task for task in self._tasks if task is not current and not task.done()]
            if not tasks:
                return []
            for task in tasks:
                task.cancel()
            _, pending = await asyncio.wait(tasks, timeout=timeout_s)
            if pending:
                return sorted(task.get_name() for task in pending)

    def release(self) -> None:
        """The call has ended: drop the owner's callbacks (they reference the session, which references this
        owner; without them reference counting frees the call at once, no full GC pass needed: ADR 0006)."""
        self.closing = True
        self._on_error = _ignore_error
        self._on_critical = _ignore

    def pulse(self) -> None:
        """Something waiters may care about changed."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    async def wait_until(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``predicate()`` holds (re-checked on every pulse); False on timeout."""
        try:
            async with asyncio.timeout(timeout_s):
                while not predicate():
                    if self._changed is None:
                        self._changed = asyncio.Event()
                    await self._changed.wait()
        except TimeoutError:
            return False
        return True

    def _done(self, coro: Coroutine[Any, Any, Any], task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        # A task cancelled before its first step never awaited ``coro``: close it (no "never awaited" warning).
        # Only a Python coroutine warns; a compiled one (gateway.compiled) fails to close unstarted, and is freed
        # by reference counting like any object.
        if isinstance(coro, types.CoroutineType):
            coro.close()
        if task.cancelled():
            # Reading it clears the task's CancelledError, whose traceback holds the task's frames (and through
            # them the task): a reference cycle per cancelled task otherwise.
            with contextlib.suppress(asyncio.CancelledError):
                task.result()
        else:
            task.exception()  # an unguarded task's starter reads it; never "exception was never retrieved"

    async def _guard(self, coro: Coroutine[Any, Any, Any], name: str, critical: bool) -> None:
        try:
            await coro
        except Exception as exc:
            self._on_error(f"task {name}", exc)
            if critical:
                self._on_critical()
