"""Draining a media worker: it takes no new calls, lets its live ones go on, and may end them at a deadline.

A drain starts from the control plane (``POST /v1/workers/{id}/drain``), from the worker's own API (``gateway
drain``, the Kubernetes preStop hook) or from SIGTERM. From then on the SIP endpoint answers new INVITEs and
out-of-dialog OPTIONS with 503, so Kamailio's dispatcher probes mark the worker down and send new calls to the
others, the worker removes its contact from the trunk's registrar (with GATEWAY_TRUNK_REGISTER, so a trunk
that delivers calls to registered contacts stops offering them here), and it reports ``draining`` (not ready)
in its heartbeat.

With a deadline, the calls still up when it passes are ended politely, all at once: each session asks its agent
to say the goodbye (``drain_goodbye``; an agent that cannot speak, such as the echo agent, says nothing) and,
once it has been said or the session's goodbye timeout has passed, hangs up. The BYE carries an RFC 3326
``Reason`` with the end reason ``drain_deadline``, so the far end's logs say why. A call that has no session
yet (ringing, connecting) is simply hung up. A later drain may bring the deadline forward, never push it back.

With ``exit_when_empty`` the worker's ``exited`` event is set once no call is left (the process then exits 0).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from gateway.worker.legs import LegRegistry, LegState

if TYPE_CHECKING:
    from gateway.session.config import SessionConfig
    from gateway.session.session import CallSession
    from gateway.worker.settings import DrainSettings

log = logging.getLogger(__name__)

#: The end reason of the calls a drain deadline ends.
DRAIN_DEADLINE = "drain_deadline"
# Beyond the goodbye itself (the session's goodbye timeout) and the session's close: calls still up after that
# are hung up without waiting for their sessions.
_GOODBYE_SLACK_S = 10.0
_UP = (LegState.ACTIVE, LegState.HELD)  # a call whose agent can say the goodbye

Spawn = Callable[[Coroutine[Any, Any, None], str], "asyncio.Task[None]"]


class WorkerDrain:
    """The drain of one worker: whether it is draining, its deadline task and the exit-when-empty check.

    Built with the worker's registry of legs, its drain settings, the sessions' config (for the goodbye's
    timeout), a way to spawn an owned task, and ``stop_taking_calls``, which the composition root wires to what
    turns calls away (503 to INVITEs and OPTIONS, the trunk registration removed, a heartbeat now)."""

    def __init__(
        self,
        legs: LegRegistry,
        *,
        settings: DrainSettings,
        session_config: SessionConfig,
        spawn: Spawn,
        stop_taking_calls: Callable[[], None],
        worker_id: str,
    ) -> None:
        self._legs = legs
        self._settings = settings
        self._session_config = session_config
        self._spawn = spawn
        self._stop_taking_calls = stop_taking_calls
        self._worker_id = worker_id
        self.draining = False
        self.exit_when_empty = False
        self.exited = asyncio.Event()  # set once a worker draining to exit carries no call
        self.deadline: float | None = None  # loop time after which live calls are ended
        self._deadline_task: asyncio.Task[None] | None = None

    def begin(self, *, exit_when_empty: bool, deadline_s: float | None) -> None:
        """Stop taking calls; end the remaining ones ``deadline_s`` from now (None: let them run)."""
        first = not self.draining
        if first:
            until = "their end" if deadline_s is None else f"{deadline_s:g} s"
            log.info("worker %s: draining; live calls may run for %s", self._worker_id, until)
            self.draining = True
            self._stop_taking_calls()
        self.exit_when_empty = self.exit_when_empty or exit_when_empty
        if deadline_s is not None:
            loop = asyncio.get_running_loop()
            at = loop.time() + deadline_s
            if self.deadline is None or at < self.deadline:
                self.deadline = at
                if self._deadline_task is not None:
                    self._deadline_task.cancel()
                self._deadline_task = self._spawn(self._end_at(at), f"worker-{self._worker_id}-drain-deadline")
        self.check_empty()

    def check_empty(self) -> None:
        """Called when a call ends: a worker draining to exit sets ``exited`` once it carries nothing."""
        if self.draining and self.exit_when_empty and self._legs.live_count() == 0:
            self.exited.set()

    def seconds_left(self) -> float | None:
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - asyncio.get_running_loop().time())

    async def _end_at(self, at: float) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(max(0.0, at - loop.time()))
        await self.end_remaining()

    async def end_remaining(self) -> None:
        """End every live call politely (see the module docstring); returns when they are gone or given up."""
        message = self._settings.drain_goodbye
        sessions: list[CallSession] = []
        for leg in self._legs.live():
            if leg.session is not None and leg.state in _UP:
                sessions.append(leg.session)
            else:
                leg.hang_up(DRAIN_DEADLINE)
        if not sessions and self._legs.live_count() == 0:
            return
        log.info("worker %s: drain deadline reached, ending %d calls with a goodbye", self._worker_id, len(sessions))
        goodbyes = [asyncio.ensure_future(session.end_with_goodbye(DRAIN_DEADLINE, message)) for session in sessions]
        config = self._session_config
        timeout = config.goodbye_timeout_s + config.close_timeout_s + _GOODBYE_SLACK_S
        try:
            if goodbyes:
                done, pending = await asyncio.wait(goodbyes, timeout=timeout)
                for task in pending:
                    task.cancel()
                for task in done:
                    if not task.cancelled() and task.exception() is not None:
                        log.warning("worker %s: a goodbye failed: %s", self._worker_id, task.exception())
                if pending:
                    await asyncio.wait(pending)
        finally:
            for leg in self._legs.live():
                leg.hang_up(DRAIN_DEADLINE)
