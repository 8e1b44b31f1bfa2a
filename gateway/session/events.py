"""What a call session reports: frozen past-tense events, kept in a bounded ring with increasing ids.

The ring serves the ops API (SSE with ``Last-Event-ID``: :meth:`EventRing.events_since` says whether events were
lost to the ring's bound) and tests (:meth:`EventRing.wait_for`). Closing the ring wakes every waiter; iterators
from :meth:`EventRing.follow` then finish.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Literal

from gateway.session.state import CallState


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionEvent:
    """Base of everything a session records."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StateChanged(SessionEvent):
    old: CallState
    new: CallState
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class TranscriptUpdated(SessionEvent):
    """A final transcript of one caller or agent item."""

    role: Literal["user", "assistant", "system"]
    item_id: str
    text: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DtmfReceived(SessionEvent):
    digit: str
    duration_ms: int
    forwarded: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class InterruptedItem:
    """An agent audio item cut by barge-in: what the caller heard (sent) against what the provider sent us."""

    response_id: str
    item_id: str
    content_index: int
    sent_ms: int
    received_ms: int

    @property
    def audio_end_ms(self) -> int:
        return min(self.sent_ms, self.received_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class BargedIn(SessionEvent):
    """The caller (or the API's ``say`` with interrupt, trigger ``api``) interrupted the agent. ``truncated``:
    truncate/delete was sent for ``items``."""

    trigger: Literal["speech_started", "provider_interrupted", "local_vad", "api"]
    response_id: str
    items: tuple[InterruptedItem, ...]
    cancelled: bool
    truncated: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class GuardrailTripped(SessionEvent):
    """An output guardrail judged the agent's response (``guardrail.tripped``); once per response.

    The agent was cut like a barge-in (``items``: what the caller was sent of each; ``cancelled``/``truncated``
    as in :class:`BargedIn`) and, when ``followed_up``, a follow-up naming the guardrail was sent (one until the
    caller speaks again, so a follow-up that trips too cannot loop). ``received_at``: the session clock
    when the judged text reached the gateway; ``stopped_at``/``stopped_frame``: the first media tick that sent
    no more of it (None when the call ended before another tick).
    """

    guardrail: str
    reason: str
    response_id: str
    item_id: str
    items: tuple[InterruptedItem, ...]
    cancelled: bool
    truncated: bool
    followed_up: bool
    received_at: float
    stopped_at: float | None
    stopped_frame: int | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeStarted(SessionEvent):
    cause: Literal["dropped", "errored", "expiring", "rotation"]
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeAttemptFailed(SessionEvent):
    attempt: int
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Resumed(SessionEvent):
    cause: str
    attempts: int
    epoch: int
    held_frames: int
    used_handle: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeFailed(SessionEvent):
    """No new connection could be made; ``fatal`` False means the old connection still carries the call."""

    attempts: int
    error: str
    fatal: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileUpdated(SessionEvent):
    name: str
    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileUpdateFailed(SessionEvent):
    name: str
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class HandoffStarted(SessionEvent):
    """``agent.handoff_started``: the call is being handed from one agent profile to another."""

    from_profile: str
    to_profile: str
    reason: str
    initiator: Literal["agent", "api"]


@dataclass(frozen=True, slots=True, kw_only=True)
class HandedOff(SessionEvent):
    """``agent.handed_off``: the new agent has the call (connection ``epoch``)."""

    from_profile: str
    to_profile: str
    reason: str
    initiator: Literal["agent", "api"]
    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class HandoffFailed(SessionEvent):
    """``agent.handoff_failed``: the previous agent keeps the call."""

    from_profile: str
    to_profile: str
    reason: str
    initiator: Literal["agent", "api"]
    error: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallStarted(SessionEvent):
    call_id: str
    name: str
    arguments: str
    queued: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallRepeated(SessionEvent):
    """The provider asked again for a call_id already run or running: it is not run twice."""

    call_id: str
    name: str
    resent: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallPromoted(SessionEvent):
    """The tool outlived the grace period: the agent was told the result will follow."""

    call_id: str
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallFinished(SessionEvent):
    call_id: str
    name: str
    ok: bool
    output: str
    duration_ms: int
    background: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResultDelivered(SessionEvent):
    call_id: str
    name: str
    kind: Literal["output", "interim", "background"]
    epoch: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResultUndelivered(SessionEvent):
    call_id: str
    name: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class NoticeReceived(SessionEvent):
    """A benign provider notice (never call-fatal)."""

    code: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ErrorOccurred(SessionEvent):
    """Something failed and was contained. ``where`` names the task or handler."""

    where: str
    error_type: str
    message: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CallHeld(SessionEvent):
    """The call went on hold (gateway/session/hold.py): agent playout paused with ``queued_ms`` of its audio kept;
    ``cancelled_response`` is the response the provider was told to stop generating ("" when none ran)."""

    by: Literal["caller", "gateway"]
    queued_ms: int
    cancelled_response: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CallResumed(SessionEvent):
    """The call came off hold after ``held_s``; playout continues with ``queued_ms`` of kept agent audio."""

    by: Literal["caller", "gateway"]
    held_s: float
    queued_ms: int


@dataclass(frozen=True, slots=True, kw_only=True)
class NoInputPrompted(SessionEvent):
    """The caller was silent for ``silent_s`` while the agent waited: the agent was asked to check on them."""

    silent_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class AmdDetected(SessionEvent):
    """Answering-machine detection decided (human, machine, fax, unknown) ``at_s`` seconds after the answer."""

    result: str
    reason: str
    at_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class VoicemailBeepHeard(SessionEvent):
    """The machine's beep came (or its greeting ended) ``at_s`` seconds after the answer: the message is left."""

    at_s: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionEnded(SessionEvent):
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class EventRecord:
    id: int
    at: float
    event: SessionEvent


class EventRingClosedError(Exception):
    """The session ended before the awaited event was recorded."""


class EventRing:
    """Bounded ring of EventRecords; ids start at 1 and increase by one per event."""

    def __init__(self, capacity: int, clock: Callable[[], float]) -> None:
        self._records: deque[EventRecord] = deque(maxlen=capacity)
        self._clock = clock
        self._last_id = 0
        self._closed = False
        self._changed: asyncio.Event | None = None

    @property
    def last_id(self) -> int:
        return self._last_id

    @property
    def closed(self) -> bool:
        return self._closed

    def append(self, event: SessionEvent) -> EventRecord:
        self._last_id += 1
        record = EventRecord(id=self._last_id, at=self._clock(), event=event)
        self._records.append(record)
        self._wake()
        return record

    def close(self) -> None:
        """No more events will come: wake every waiter."""
        self._closed = True
        self._wake()

    def events_since(self, last_id: int) -> tuple[list[EventRecord], bool]:
        """Records with id > ``last_id``; ``gap`` is True when some of them already fell out of the ring."""
        if not self._records:
            return [], last_id < self._last_id
        first = self._records[0].id
        gap = last_id < first - 1
        start = max(0, last_id - first + 1)
        return [self._records[i] for i in range(start, len(self._records))], gap

    async def wait_since(self, last_id: int, *, timeout_s: float | None = None) -> tuple[list[EventRecord], bool]:
        """Like events_since, but waits until there is something newer or the ring closes (empty list then)."""
        async with asyncio.timeout(timeout_s):
            while self._last_id <= last_id and not self._closed:
                await self._next_change()
        return self.events_since(last_id)

    async def wait_for(
        self, predicate: Callable[[SessionEvent], bool], *, after_id: int = 0, timeout_s: float
    ) -> EventRecord:
        """The first record after ``after_id`` whose event matches; raises TimeoutError or EventRingClosedError."""
        seen = after_id
        async with asyncio.timeout(timeout_s):
            while True:
                records, _ = self.events_since(seen)
                for record in records:
                    if predicate(record.event):
                        return record
                    seen = record.id
                if self._closed:
                    raise EventRingClosedError("the session ended before a matching event was recorded")
                await self._next_change()

    async def follow(self, last_id: int = 0) -> AsyncIterator[EventRecord]:
        """Every record after ``last_id`` as it is recorded; ends once the ring is closed and drained."""
        seen = last_id
        while True:
            records, _ = self.events_since(seen)
            for record in records:
                seen = record.id
                yield record
            if self._closed:
                return
            if not records:
                await self._next_change()

    async def _next_change(self) -> None:
        if self._changed is None:
            self._changed = asyncio.Event()
        await self._changed.wait()

    def _wake(self) -> None:
        # Only allocate a wake-up when someone waits: appends happen inside the media tick.
        if self._changed is not None:
            self._changed.set()
            self._changed = None
