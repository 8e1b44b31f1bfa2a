"""Opening, installing and closing the provider connections of one call.

A session returned by ``connect`` is tracked from the moment it exists until it is installed as the current
link or closed, so a connection that completes while the call is ending is closed rather than leaked. Connecting
on behalf of a caller outside the session (start, profile update) runs in an owned task, so ending the call
cancels the attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.providers.base import AgentProfile, HistoryItem, RealtimeModel, RealtimeSession
from gateway.session.config import SessionConfig
from gateway.session.errors import SessionStateError
from gateway.session.pipe import Link, ProviderPipe
from gateway.session.tasks import TaskOwner


def _ignore_error(where: str, exc: BaseException) -> None:
    pass


async def _no_listener(link: Link) -> None:
    pass


class Connections:
    def __init__(
        self,
        *,
        model: RealtimeModel,
        config: SessionConfig,
        pipe: ProviderPipe,
        tasks: TaskOwner,
        clock: Callable[[], float],
        on_error: Callable[[str, BaseException], None],
        listen: Callable[[Link], Coroutine[Any, Any, None]],
    ) -> None:
        self._model = model
        self._config = config
        self._pipe = pipe
        self._tasks = tasks
        self._clock = clock
        self._on_error = on_error
        self._listen = listen
        self._links: set[Link] = set()
        self._pending: set[RealtimeSession] = set()

    def use_model(self, model: RealtimeModel) -> None:
        """Connections from now on go to ``model`` (a handoff to a profile of another provider)."""
        self._model = model

    async def connect(
        self,
        profile: AgentProfile,
        *,
        history: tuple[HistoryItem, ...],
        resume_handle: str | None = None,
        model: RealtimeModel | None = None,
    ) -> RealtimeSession:
        async with asyncio.timeout(self._config.connect_timeout_s):
            session = await (model or self._model).connect(profile, history=history, resume_handle=resume_handle)
        self._pending.add(session)
        if self._tasks.closing:
            await self.close_session(session)
            raise SessionStateError("the call ended while connecting")
        return session

    async def connect_owned(
        self, profile: AgentProfile, *, history: tuple[HistoryItem, ...], model: RealtimeModel | None = None
    ) -> RealtimeSession:
        """connect() in an owned task: ending the call cancels it. ``model``: another model than the current."""
        task = self._tasks.spawn(self.connect(profile, history=history, model=model), name="connect", guard=False)
        if task is None:
            raise SessionStateError("the call is ending")
        try:
            await asyncio.wait({task})
        except BaseException:
            task.cancel()
            raise
        if task.cancelled():
            raise SessionStateError("the call ended while connecting")
        session: RealtimeSession = task.result()
        return session

    def install(self, session: RealtimeSession) -> tuple[Link, Link | None]:
        """Make ``session`` current (new epoch) and start its listener; returns it and the previous link."""
        self._pending.discard(session)
        link, old = self._pipe.install(session, now=self._clock())
        self._links.add(link)
        link.listener_task = self._tasks.spawn(self._listen(link), name=f"listener:{link.epoch}")
        return link, old

    def retire(self, old: Link | None) -> None:
        """Stop using ``old`` and close it in the background."""
        if old is not None:
            old.stale = True
            self._tasks.spawn(self.close_link(old), name=f"close-link:{old.epoch}")

    async def close_link(self, link: Link) -> None:
        listener = link.listener_task
        if listener is not None and listener is not asyncio.current_task() and not listener.done():
            listener.cancel()
            await asyncio.wait({listener}, timeout=self._config.close_timeout_s)
        await self.close_session(link.session)
        link.closed = True
        self._links.discard(link)

    async def close_session(self, session: RealtimeSession) -> None:
        self._pending.discard(session)
        try:
            async with asyncio.timeout(self._config.close_timeout_s):
                await session.aclose()
        except Exception as exc:
            self._on_error("closing the provider session", exc)

    def release(self) -> None:
        """The call has ended: drop the session's callbacks (reference cycles: ADR 0006)."""
        self._on_error = _ignore_error
        self._listen = _no_listener

    async def close_all(self) -> None:
        """At call end (after tasks are cancelled): close every link and every connection not yet installed."""
        self._pipe.retire()
        for link in list(self._links):
            await self.close_link(link)
        for session in list(self._pending):
            await self.close_session(session)
