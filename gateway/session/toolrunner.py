"""Running the agent's tool calls for one call: once per provider call_id, with grace-period promotion to the
background, a bounded number of background runs (later long requests queue, never get lost), and delivery that
survives provider reconnects.

Rules:
- A call_id already run or running is never run again. Asked again, a run whose function output already
  reached a provider has it re-sent; otherwise the pending delivery covers it.
- Outputs go through the host's send queue, which retries a failed send on the next connection without
  re-running the tool; an output that never reached a provider by call end is reported (ToolResultUndelivered).
- A foreground tool still running after ``tool_grace_s`` (only tools with ``background_ok``) is promoted: the
  provider gets an interim output at once and the conversation goes on; the real result is delivered as a text
  item plus a response request the next time the host says the agent is idle.
- A background-capable request arriving while ``background_slots`` background runs are busy is queued: the
  provider gets a "queued" interim output and the run starts, in the background, when a slot frees.
- After normal outputs a response is requested once no other foreground tool is still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal, Protocol

from gateway.session.calltrace import tool_key
from gateway.session.config import SessionConfig
from gateway.session.control import CallControl
from gateway.session.events import (
    ErrorOccurred,
    SessionEvent,
    ToolCallFinished,
    ToolCallPromoted,
    ToolCallRepeated,
    ToolCallStarted,
    ToolResultDelivered,
    ToolResultUndelivered,
)
from gateway.session.tools import Tool, ToolActions, ToolError, ToolInvocation
from gateway.tracing import CallTrace

log = logging.getLogger(__name__)

INTERIM_OUTPUT = json.dumps(
    {"status": "pending", "message": "Working on it; the result will follow. Tell the caller and carry on."}
)
QUEUED_OUTPUT = json.dumps(
    {"status": "queued", "message": "Another request is still running; this one runs next and its result will follow."}
)


def error_output(message: str) -> str:
    return json.dumps({"error": message})


class ToolLookup(Protocol):
    """Where the runner finds a tool by name (a ToolRegistry, or the session's handoff-aware lookup)."""

    def get(self, name: str) -> Tool | None: ...


class ToolHost(Protocol):
    """What the runner needs from its session."""

    @property
    def session_id(self) -> str: ...

    @property
    def actions(self) -> ToolActions: ...

    @property
    def closing(self) -> bool: ...

    def spawn(self, coro: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None] | None: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> asyncio.TimerHandle | None: ...

    def send_tool_output(self, call_id: str, name: str, output: str, *, on_sent: Callable[[int], None]) -> None:
        """Queue a function output; retried on the next connection until it is sent or the call ends."""
        ...

    def send_text(self, text: str, *, role: Literal["user", "system"], on_sent: Callable[[int], None]) -> None: ...

    def request_response(self) -> None: ...

    def record(self, event: SessionEvent) -> None: ...

    def now(self) -> float: ...


@dataclass(slots=True, kw_only=True, eq=False)
class ToolRun:
    call_id: str
    name: str
    arguments: str
    status: Literal["queued", "running", "done"] = "running"
    promoted: bool = False
    started_at: float = 0.0
    output: str | None = None
    ok: bool = False
    function_output: str | None = None  # what the provider gets as the call's output (result or interim)
    output_sent: bool = False
    result_sent: bool = False  # background result delivered as a text item
    unwanted: bool = False
    ended_call: bool = False
    timer: asyncio.TimerHandle | None = None


class _RunActions:
    """The session's actions, noting when this run ends the call (its output is then not expected anywhere)."""

    def __init__(self, actions: ToolActions, run: ToolRun) -> None:
        self._actions = actions
        self._run = run

    @property
    def control(self) -> CallControl:
        return self._actions.control

    async def wait_agent_quiet(self, timeout_s: float) -> bool:
        return await self._actions.wait_agent_quiet(timeout_s)

    def end_call(self, reason: str) -> None:
        self._run.ended_call = True
        self._actions.end_call(reason)


class ToolRunner:
    def __init__(
        self, host: ToolHost, registry: ToolLookup, config: SessionConfig, *, trace: CallTrace | None = None
    ) -> None:
        self._host = host
        self._trace = trace
        self._registry = registry
        self._config = config
        self.runs: dict[str, ToolRun] = {}
        self._queued: deque[tuple[ToolRun, Tool, Mapping[str, Any]]] = deque()
        self._ready: deque[ToolRun] = deque()
        self._foreground = 0
        self._background = 0
        self.calls = 0
        self.errors = 0
        self.promoted = 0

    @property
    def has_ready(self) -> bool:
        """Background results wait for the agent to be idle."""
        return bool(self._ready)

    @property
    def foreground_running(self) -> int:
        return self._foreground

    @property
    def running(self) -> int:
        """Tools running now, foreground and background (the no-input timer waits for them)."""
        return self._foreground + self._background

    def request(self, call_id: str, name: str, arguments: str) -> None:
        """The provider asks for a tool call."""
        run = self.runs.get(call_id)
        if run is not None:
            resend = run.output_sent and run.function_output is not None
            self._host.record(ToolCallRepeated(call_id=call_id, name=run.name, resent=resend))
            if resend and run.function_output is not None:
                kind: Literal["output", "interim"] = "interim" if run.promoted else "output"
                self._send_function_output(run, run.function_output, kind=kind)
                self._respond_if_settled()
            return
        self.calls += 1
        run = ToolRun(call_id=call_id, name=name, arguments=arguments, started_at=self._host.now())
        self.runs[call_id] = run
        tool = self._registry.get(name)
        if tool is None:
            self._fail_at_once(run, f"unknown tool {name!r}")
            return
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            self._fail_at_once(run, "arguments are not valid JSON")
            return
        if not isinstance(parsed, dict):
            self._fail_at_once(run, "arguments must be a JSON object")
            return
        if tool.background_ok and self._background >= self._config.background_slots:
            run.status = "queued"
            run.promoted = True
            self._queued.append((run, tool, parsed))
            self._host.record(ToolCallStarted(call_id=call_id, name=name, arguments=arguments, queued=True))
            self._send_function_output(run, QUEUED_OUTPUT, kind="interim")
            self._respond_if_settled()
            return
        self._host.record(ToolCallStarted(call_id=call_id, name=name, arguments=arguments, queued=False))
        self._start(run, tool, parsed, background=False)

    def cancel_wanted(self, call_ids: tuple[str, ...]) -> None:
        """The provider no longer wants these results (Gemini toolCallCancellation). Runs finish, unreported."""
        for call_id in call_ids:
            run = self.runs.get(call_id)
            if run is None or run.status == "done" or run.unwanted:
                continue
            run.unwanted = True
            if run.status == "queued":
                self._queued = deque(entry for entry in self._queued if entry[0] is not run)
                run.status = "done"
            self._host.record(ToolResultUndelivered(call_id=call_id, name=run.name, reason="cancelled by provider"))

    def on_idle(self) -> None:
        """The agent is idle: deliver the oldest finished background result (one per idle moment)."""
        if not self._ready:
            return
        run = self._ready.popleft()
        text = f"Result of the earlier {run.name} request (tool call {run.call_id}): {run.output}"

        def sent(epoch: int) -> None:
            run.result_sent = True
            self._host.record(ToolResultDelivered(call_id=run.call_id, name=run.name, kind="background", epoch=epoch))

        self._host.send_text(text, role=self._config.background_result_role, on_sent=sent)
        self._host.request_response()

    def finish(self) -> None:
        """The call ends: stop timers and report every result that never reached a provider."""
        for run in self.runs.values():
            if run.timer is not None:
                run.timer.cancel()
                run.timer = None
            if run.unwanted or run.ended_call:
                continue
            reason = ""
            if run.status != "done":
                reason = "call ended while the tool was running"
            elif run.promoted and not run.result_sent:
                reason = "call ended before the background result was delivered"
            elif not run.promoted and not run.output_sent:
                reason = "call ended before the output reached a provider"
            if reason:
                self._host.record(ToolResultUndelivered(call_id=run.call_id, name=run.name, reason=reason))
        self._queued.clear()
        self._ready.clear()

    # ------------------------------------------------------------------------------------------ internals

    def _start(self, run: ToolRun, tool: Tool, arguments: Mapping[str, Any], *, background: bool) -> None:
        run.status = "running"
        run.started_at = self._host.now()
        timeout = self._config.background_timeout_s if tool.background_ok else self._config.tool_timeout_s
        invocation = ToolInvocation(
            session_id=self._host.session_id,
            call_id=run.call_id,
            name=run.name,
            arguments=arguments,
            actions=_RunActions(self._host.actions, run),
        )
        if background:
            self._background += 1
        else:
            self._foreground += 1
            if tool.background_ok:
                run.timer = self._host.call_later(self._config.tool_grace_s, partial(self._promote, run))
        task = self._host.spawn(self._execute(run, tool, invocation, timeout), name=f"tool:{run.name}:{run.call_id}")
        if task is not None:
            task.add_done_callback(partial(self._task_done, run))

    def _task_done(self, run: ToolRun, task: asyncio.Task[None]) -> None:
        if task.cancelled() and run.status != "done" and not self._host.closing:
            # Cancelled by something other than the end of the call (even before it ran): the agent must not
            # wait forever for this output.
            self._finished(run, error_output(f"{run.name} was cancelled"), ok=False)

    async def _execute(self, run: ToolRun, tool: Tool, invocation: ToolInvocation, timeout_s: float) -> None:
        ok = False
        # Under the call's tool span (gateway/session/calltrace.py): a webhook's HTTP span is its child.
        active = self._trace.active(tool_key(run.call_id)) if self._trace is not None else contextlib.nullcontext()
        try:
            async with asyncio.timeout(timeout_s):
                with active:
                    result: Any = await tool.run(invocation)
            output = result if isinstance(result, str) else json.dumps(result)
            ok = True
        except TimeoutError:
            output = error_output(f"{run.name} timed out after {timeout_s:g} s")
        except ToolError as exc:
            output = error_output(str(exc))
        except Exception as exc:
            log.exception("tool %s (%s) raised", run.name, run.call_id)
            self._host.record(ErrorOccurred(where=f"tool {run.name}", error_type=type(exc).__name__, message=str(exc)))
            output = error_output(f"{run.name} failed: {type(exc).__name__}")
        self._finished(run, output, ok=ok)

    def _promote(self, run: ToolRun) -> None:
        run.timer = None
        if run.status != "running" or run.promoted:
            return
        run.promoted = True
        self._foreground -= 1
        self._background += 1
        self.promoted += 1
        self._host.record(ToolCallPromoted(call_id=run.call_id, name=run.name))
        if not run.unwanted:
            self._send_function_output(run, INTERIM_OUTPUT, kind="interim")
        self._respond_if_settled()

    def _finished(self, run: ToolRun, output: str, *, ok: bool) -> None:
        if run.status == "done":
            return
        run.status = "done"
        run.output = output
        run.ok = ok
        if run.timer is not None:
            run.timer.cancel()
            run.timer = None
        if not ok:
            self.errors += 1
        duration_ms = round((self._host.now() - run.started_at) * 1000)
        self._host.record(
            ToolCallFinished(
                call_id=run.call_id,
                name=run.name,
                ok=ok,
                output=output,
                duration_ms=duration_ms,
                background=run.promoted,
            )
        )
        if run.promoted:
            self._background -= 1
            if not run.unwanted:
                self._ready.append(run)
            self._start_queued()
        else:
            self._foreground -= 1
            if not run.unwanted:
                self._send_function_output(run, output, kind="output")
                self._respond_if_settled()

    def _fail_at_once(self, run: ToolRun, message: str) -> None:
        self._host.record(ToolCallStarted(call_id=run.call_id, name=run.name, arguments=run.arguments, queued=False))
        self._foreground += 1
        self._finished(run, error_output(message), ok=False)

    def _start_queued(self) -> None:
        while self._queued and self._background < self._config.background_slots:
            run, tool, arguments = self._queued.popleft()
            self._start(run, tool, arguments, background=True)

    def _send_function_output(self, run: ToolRun, output: str, *, kind: Literal["output", "interim"]) -> None:
        run.function_output = output

        def sent(epoch: int) -> None:
            run.output_sent = True
            self._host.record(ToolResultDelivered(call_id=run.call_id, name=run.name, kind=kind, epoch=epoch))

        self._host.send_tool_output(run.call_id, run.name, output, on_sent=sent)

    def _respond_if_settled(self) -> None:
        if self._foreground == 0:
            self._host.request_response()
