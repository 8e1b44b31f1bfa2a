"""The session's part of a call's trace (gateway/tracing.py): provider connects, turns, tools, resumes, handoffs.

Every span is opened and ended from a session event or a connect attempt, never from the media tick's
per-frame path: a turn's span is made whole when its first agent frame is played, from the latency the turn
tracker measured (caller stopped speaking -> first agent audio to the caller).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from opentelemetry.util.types import Attributes

from gateway.session.events import (
    BargedIn,
    DtmfReceived,
    ResumeAttemptFailed,
    Resumed,
    ResumeFailed,
    ResumeStarted,
    SessionEvent,
    ToolCallFinished,
    ToolCallStarted,
)
from gateway.tracing import CallTrace

TOOL_ERROR_MAX = 256  # characters of a failed tool's output kept as its span's status


def tool_key(call_id: str) -> str:
    return f"tool:{call_id}"


class SessionTrace:
    def __init__(self, trace: CallTrace, *, provider: str) -> None:
        self.trace = trace
        self.provider = provider
        self.turns = 0
        self.handoffs = 0

    @contextlib.contextmanager
    def connect(self, attempt: int, *, resuming: bool) -> Iterator[None]:
        """A provider connect attempt (under the resume span while resuming); an error ends it in error."""
        trace = self.trace
        attributes: Attributes = {"gateway.provider": self.provider, "gateway.connect.attempt": attempt}
        parent = "resume" if resuming and trace.is_open("resume") else None
        trace.start("connect", "provider.connect", attributes, parent=parent)
        try:
            yield
        except BaseException as exc:
            trace.end("connect", error=f"{type(exc).__name__}: {exc}")
            raise
        trace.end("connect")

    def turn(self, waited_s: float) -> None:
        """A turn's reply reached the caller ``waited_s`` after the caller stopped speaking."""
        self.turns += 1
        end = time.time()
        attributes = {"gateway.turn.index": self.turns, "gateway.turn.latency_ms": round(waited_s * 1000.0, 1)}
        self.trace.span("call.turn", attributes, start_time_s=end - waited_s, end_time_s=end)

    def on_event(self, event: SessionEvent) -> None:
        trace = self.trace
        if isinstance(event, ToolCallStarted):
            attributes: Attributes = {
                "gateway.tool.name": event.name,
                "gateway.tool.call_id": event.call_id,
                "gateway.tool.queued": event.queued,
            }
            trace.start(tool_key(event.call_id), "tool.call", attributes)
        elif isinstance(event, ToolCallFinished):
            outcome = {
                "gateway.tool.ok": event.ok,
                "gateway.tool.duration_ms": event.duration_ms,
                "gateway.tool.background": event.background,
            }
            trace.end(tool_key(event.call_id), outcome, error="" if event.ok else event.output[:TOOL_ERROR_MAX])
        elif isinstance(event, ResumeStarted):
            trace.start("resume", "call.resume", {"gateway.resume.cause": event.cause})
        elif isinstance(event, ResumeAttemptFailed):
            trace.event("resume_attempt_failed", {"attempt": event.attempt, "error": event.error})
        elif isinstance(event, Resumed):
            trace.end(
                "resume", {"gateway.resume.attempts": event.attempts, "gateway.resume.held_frames": event.held_frames}
            )
        elif isinstance(event, ResumeFailed):
            trace.end("resume", {"gateway.resume.attempts": event.attempts}, error=event.error)
        elif isinstance(event, BargedIn):
            trace.event("barge_in", {"trigger": event.trigger, "truncated": event.truncated})
        elif isinstance(event, DtmfReceived):
            trace.event("dtmf", {"digit": event.digit})

    # The hook for agent handoffs (events agent.handoff_started / agent.handed_off / agent.handoff_failed):
    # whoever emits them calls these two, and the handoff becomes a span from start to outcome.

    def handoff_started(self, *, target: str, source: str = "") -> None:
        self.handoffs += 1
        self.trace.start("handoff", "agent.handoff", {"gateway.handoff.target": target, "gateway.handoff.from": source})

    def handoff_ended(self, *, ok: bool, error: str = "") -> None:
        self.trace.end("handoff", {"gateway.handoff.ok": ok}, error="" if ok else (error or "handoff failed"))
