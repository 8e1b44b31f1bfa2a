"""The call as its tool runner and tools see it (ToolHost + ToolActions): spawn owned tasks and timers, queue
function outputs and text items toward the provider (retried on the next connection, entered in the transcript
once sent), request responses, wait for the agent to be quiet, end the call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any, Literal

from gateway.providers.base import RealtimeSession
from gateway.session.control import CallControl
from gateway.session.events import EventRing, SessionEvent
from gateway.session.pipe import ProviderPipe, SendOp, send_text, send_tool_result
from gateway.session.tasks import TaskOwner
from gateway.session.tools import ToolActions
from gateway.session.transcript import Transcript


def _ignore() -> None:
    pass


def _quiet() -> bool:
    return True


def _ignore_reason(reason: str) -> None:
    pass


def _not_retired(call_id: str, name: str, output: str) -> str | None:
    return None


class SessionToolHost:
    def __init__(
        self,
        *,
        session_id: str,
        control: CallControl,
        tasks: TaskOwner,
        pipe: ProviderPipe,
        transcript: Transcript,
        events: EventRing,
        clock: Callable[[], float],
        request_response: Callable[[], None],
        agent_quiet: Callable[[], bool],
        end_call: Callable[[str], None],
        retired_output: Callable[[str, str, str], str | None] = _not_retired,
        retired_role: Literal["user", "system"] = "system",
        observe: Callable[[SessionEvent], None] | None = None,
    ) -> None:
        self._retired_output = retired_output
        self._retired_role: Literal["user", "system"] = retired_role
        self._session_id = session_id
        self._observe = observe  # the call's trace sees the tools' events too
        self._control = control
        self._tasks = tasks
        self._pipe = pipe
        self._transcript = transcript
        self._events = events
        self._clock = clock
        self._request_response = request_response
        self._agent_quiet = agent_quiet
        self._end_call = end_call

    def release(self) -> None:
        """The call has ended: drop the session's callbacks (reference cycles: ADR 0006)."""
        self._request_response = _ignore
        self._agent_quiet = _quiet
        self._end_call = _ignore_reason
        self._retired_output = _not_retired

    @property
    def session_id(self) -> str:
        return self._session_id

    @property
    def actions(self) -> ToolActions:
        return self

    @property
    def closing(self) -> bool:
        return self._tasks.closing

    @property
    def control(self) -> CallControl:
        return self._control

    def spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None] | None:
        return self._tasks.spawn(coro, name=name)

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle | None:
        return self._tasks.call_later(delay, callback)

    def send_tool_output(self, call_id: str, name: str, output: str, *, on_sent: Callable[[int], None]) -> None:
        # Decided when sent, not when queued: a handoff in between retires the call (gateway/session/handoff.py),
        # and the agent that has the call then gets the result as a message, never as a function output.
        given: list[str | None] = [None]

        async def send(session: RealtimeSession) -> None:
            text = given[0] = self._retired_output(call_id, name, output)
            if text is None:
                await send_tool_result(session, call_id=call_id, output=output, name=name)
            elif text:
                await send_text(session, text=text, role=self._retired_role)

        def sent(epoch: int) -> None:
            text = given[0]
            if text is None:
                self._transcript.function_output(call_id, output)
            elif text:
                self._transcript.message(self._retired_role, text)
            on_sent(epoch)

        self._pipe.enqueue(SendOp(name=f"tool-output:{call_id}", send=send, retry=True, on_sent=sent))

    def send_text(self, text: str, *, role: Literal["user", "system"], on_sent: Callable[[int], None]) -> None:
        def sent(epoch: int) -> None:
            self._transcript.message(role, text)
            on_sent(epoch)

        self._pipe.enqueue(
            SendOp(name="text-item", send=partial(send_text, text=text, role=role), retry=True, on_sent=sent)
        )

    def request_response(self) -> None:
        self._request_response()

    def record(self, event: SessionEvent) -> None:
        self._events.append(event)
        if self._observe is not None:
            self._observe(event)

    def now(self) -> float:
        return self._clock()

    async def wait_agent_quiet(self, timeout_s: float) -> bool:
        return await self._tasks.wait_until(self._agent_quiet, timeout_s)

    def end_call(self, reason: str) -> None:
        self._end_call(reason)
