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
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.session.session import CallSession
    from gateway.worker.worker import MediaWorker

log = logging.getLogger(__name__)

#: The end reason of the calls a drain deadline ends.
DRAIN_DEADLINE = "drain_deadline"
# Beyond the goodbye itself (the session's goodbye timeout) and the session's close: calls still up after that
# are hung up without waiting for their sessions.
_GOODBYE_SLACK_S = 10.0


class WorkerDrain:
    """The drain of one worker: its deadline task and the exit-when-empty check."""

    def __init__(self, worker: MediaWorker) -> None:
        self._worker = worker
        self.deadline: float | None = None  # loop time after which live calls are ended
        self._deadline_task: asyncio.Task[None] | None = None

    def begin(self, *, exit_when_empty: bool, deadline_s: float | None) -> None:
        """Stop taking calls; end the remaining ones ``deadline_s`` from now (None: let them run)."""
        worker = self._worker
        first = not worker.draining
        if first:
            until = "their end" if deadline_s is None else f"{deadline_s:g} s"
            log.info("worker %s: draining; live calls may run for %s", worker.id, until)
        worker.draining = True
        worker.endpoint.set_accepting_calls(False)
        if first:
            worker.registration.begin_unregister("drain")  # the trunk's registrar stops offering calls here
            worker.heartbeat_soon()
        worker.exit_when_empty = worker.exit_when_empty or exit_when_empty
        if deadline_s is not None:
            loop = asyncio.get_running_loop()
            at = loop.time() + deadline_s
            if self.deadline is None or at < self.deadline:
                self.deadline = at
                if self._deadline_task is not None:
                    self._deadline_task.cancel()
                self._deadline_task = worker.spawn(self._end_at(at), name=f"worker-{worker.id}-drain-deadline")
        self.check_empty()

    def check_empty(self) -> None:
        """Called when a call ends: a worker draining to exit sets ``exited`` once it carries nothing."""
        worker = self._worker
        if worker.draining and worker.exit_when_empty and worker.live_calls() == 0:
            worker.exited.set()

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
        worker = self._worker
        message = worker.settings.drain.drain_goodbye
        sessions: list[CallSession] = []
        for leg in list(worker.legs.values()):
            if not leg.live:
                continue
            if leg.session is not None and leg.state == "active":
                sessions.append(leg.session)
            else:
                worker.sip_calls.hang_up_leg(leg, DRAIN_DEADLINE)
        for browser in list(worker.webrtc.legs.values()):
            if not browser.live:
                continue
            if browser.session is not None and browser.state == "active":
                sessions.append(browser.session)
            else:
                worker.webrtc.hang_up_leg(browser, DRAIN_DEADLINE)
        if not sessions and worker.live_calls() == 0:
            return
        log.info("worker %s: drain deadline reached, ending %d calls with a goodbye", worker.id, len(sessions))
        goodbyes = [asyncio.ensure_future(session.end_with_goodbye(DRAIN_DEADLINE, message)) for session in sessions]
        timeout = worker.session_config.goodbye_timeout_s + worker.session_config.close_timeout_s + _GOODBYE_SLACK_S
        try:
            if goodbyes:
                done, pending = await asyncio.wait(goodbyes, timeout=timeout)
                for task in pending:
                    task.cancel()
                for task in done:
                    if not task.cancelled() and task.exception() is not None:
                        log.warning("worker %s: a goodbye failed: %s", worker.id, task.exception())
                if pending:
                    await asyncio.wait(pending)
        finally:
            for leg in list(worker.legs.values()):
                if leg.live:
                    worker.sip_calls.hang_up_leg(leg, DRAIN_DEADLINE)
            for browser in list(worker.webrtc.legs.values()):
                if browser.live:
                    worker.webrtc.hang_up_leg(browser, DRAIN_DEADLINE)
