"""One fake per interface for the session core tests: a scriptable in-memory RealtimeModel/RealtimeSession, a
CallControl that records what it was asked, a manual clock, and frame helpers.

The fake provider session records every send as a tuple, raises ProviderClosedError after it was closed or
dropped, can fail a named send on demand, and emits whatever events a test pushes, in order.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

from gateway.providers.base import (
    AgentProfile,
    AudioDone,
    AudioReceived,
    Capabilities,
    HistoryItem,
    ProviderDisconnected,
    ProviderEvent,
    ProviderNoticed,
    ResponseDone,
    ResponseStarted,
)
from gateway.providers.errors import ProviderClosedError
from gateway.session import CallSession, SessionConfig, TransferOutcome
from gateway.session.control import WarmTransferStart
from gateway.session.events import NoticeReceived, SessionEvent, StateChanged
from gateway.session.state import CallState
from gateway.session.tools import ToolRegistry
from gateway.tracing import CallTrace
from telcodecs.frames import FRAME_SAMPLES, Frame

DEADLINE = 5.0


class _Pulse:
    """Wake every waiter whenever something changes; waiters re-check their condition."""

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None

    def fire(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    async def until(self, predicate: Callable[[], Any], timeout_s: float = DEADLINE) -> Any:
        async with asyncio.timeout(timeout_s):
            while not (result := predicate()):
                if self._event is None:
                    self._event = asyncio.Event()
                await self._event.wait()
            return result


class _EventStream:
    def __init__(self, queue: asyncio.Queue[ProviderEvent | None]) -> None:
        self._queue = queue
        self._done = False

    def __aiter__(self) -> _EventStream:
        return self

    async def __anext__(self) -> ProviderEvent:
        if self._done:
            raise StopAsyncIteration
        event = await self._queue.get()
        if event is None:
            self._done = True
            raise StopAsyncIteration
        if isinstance(event, ProviderDisconnected):
            self._done = True
        return event


class FakeRealtimeSession:
    def __init__(
        self,
        *,
        index: int,
        profile: AgentProfile,
        history: tuple[HistoryItem, ...],
        resume_handle: str | None,
    ) -> None:
        self.index = index
        self.profile = profile
        self.history = history
        self.resume_handle = resume_handle
        self.sent: list[tuple[Any, ...]] = []
        self.fail_next: dict[str, BaseException] = {}
        self.closed = False
        self.dropped = False
        self.aclose_calls = 0
        self.sends_after_drop = 0
        self._queue: asyncio.Queue[ProviderEvent | None] = asyncio.Queue()
        self.changed = _Pulse()
        self.nowait = True  # False: every audio send takes the sender task's awaited path

    # ---------------------------------------------------------------------------- RealtimeSession

    async def send_audio(self, pcm: bytes) -> None:
        await self._op("audio", pcm)

    def send_audio_nowait(self, pcm: bytes) -> bool:
        if not self.nowait:
            return False
        self._sync_op("audio", pcm)
        return True

    async def send_text(self, text: str, *, role: Literal["user", "system"] = "user") -> None:
        await self._op("text", text, role)

    async def create_response(self, *, instructions: str | None = None) -> None:
        await self._op("create_response", instructions)

    async def cancel_response(self) -> None:
        await self._op("cancel_response")

    async def truncate_item(self, item_id: str, *, content_index: int, audio_end_ms: int) -> None:
        await self._op("truncate", item_id, content_index, audio_end_ms)

    async def delete_item(self, item_id: str) -> None:
        await self._op("delete", item_id)

    async def send_tool_result(self, call_id: str, output: str, *, name: str = "") -> None:
        await self._op("tool_result", call_id, output, name)

    def events(self) -> _EventStream:
        return _EventStream(self._queue)

    async def aclose(self) -> None:
        self.aclose_calls += 1
        if not self.closed:
            self.closed = True
            self._queue.put_nowait(None)
        self.changed.fire()

    # ------------------------------------------------------------------------------ test controls

    def emit(self, *events: ProviderEvent) -> None:
        for event in events:
            self._queue.put_nowait(event)

    def drop(self, reason: str = "connection lost", *, retryable: bool = True) -> None:
        """The remote end goes away: every later send raises, the event stream ends."""
        self.dropped = True
        self.emit(ProviderDisconnected(reason=reason, retryable=retryable))

    def of(self, kind: str) -> list[tuple[Any, ...]]:
        return [entry for entry in self.sent if entry[0] == kind]

    def audio(self) -> bytes:
        return b"".join(entry[1] for entry in self.of("audio"))

    async def wait_sent(self, predicate: Callable[[list[tuple[Any, ...]]], Any], timeout_s: float = DEADLINE) -> Any:
        return await self.changed.until(lambda: predicate(self.sent), timeout_s)

    async def _op(self, kind: str, *args: Any) -> None:
        self._sync_op(kind, *args)

    def _sync_op(self, kind: str, *args: Any) -> None:
        if self.closed or self.dropped:
            self.sends_after_drop += 1
            raise ProviderClosedError(f"fake session {self.index} is closed")
        failure = self.fail_next.pop(kind, None)
        if failure is not None:
            if isinstance(failure, ProviderClosedError):
                self.dropped = True
            raise failure
        self.sent.append((kind, *args))
        self.changed.fire()


class FakeModel:
    """A RealtimeModel whose connects follow a script, one entry per connect: an exception to raise, an
    asyncio.Event to wait for before succeeding, or None to succeed at once (also when the script is empty)."""

    def __init__(self, *, name: str = "fake", capabilities: Capabilities | None = None) -> None:
        self.name = name
        self.capabilities = capabilities or Capabilities(server_vad=True, truncate=True)
        self.script: deque[BaseException | asyncio.Event | None] = deque()
        self.gate: asyncio.Event | None = None
        self.connect_calls: list[tuple[AgentProfile, tuple[HistoryItem, ...], str | None]] = []
        self.sessions: list[FakeRealtimeSession] = []
        self.changed = _Pulse()

    async def connect(
        self,
        profile: AgentProfile,
        *,
        history: tuple[HistoryItem, ...] = (),
        resume_handle: str | None = None,
    ) -> FakeRealtimeSession:
        self.connect_calls.append((profile, history, resume_handle))
        self.changed.fire()
        if self.gate is not None:
            await self.gate.wait()
        outcome = self.script.popleft() if self.script else None
        if isinstance(outcome, asyncio.Event):
            await outcome.wait()
        elif outcome is not None:
            raise outcome
        session = FakeRealtimeSession(
            index=len(self.sessions), profile=profile, history=history, resume_handle=resume_handle
        )
        self.sessions.append(session)
        self.changed.fire()
        return session

    @property
    def last(self) -> FakeRealtimeSession:
        return self.sessions[-1]

    async def wait_sessions(self, count: int, timeout_s: float = DEADLINE) -> FakeRealtimeSession:
        await self.changed.until(lambda: len(self.sessions) >= count, timeout_s)
        return self.sessions[count - 1]

    async def wait_connects(self, count: int, timeout_s: float = DEADLINE) -> None:
        await self.changed.until(lambda: len(self.connect_calls) >= count, timeout_s)


class FakeCallControl:
    def __init__(self, *, transfer_outcome: TransferOutcome | None = None) -> None:
        self.hang_ups: list[str] = []
        self.transfers: list[str] = []
        self.dtmf: list[str] = []
        self.holds: list[bool] = []
        self.warm_transfers: list[tuple[str, str]] = []
        self.warm_start = WarmTransferStart(status="dialling", transfer_id="wt-1")
        self.warm_briefings: list[str | None] = []
        self.transfer_outcome = transfer_outcome or TransferOutcome(status="accepted", sip_status=200)

    async def hang_up(self, reason: str) -> None:
        self.hang_ups.append(reason)

    async def transfer(self, target: str) -> TransferOutcome:
        self.transfers.append(target)
        return self.transfer_outcome

    async def warm_transfer(self, target: str, summary: str, briefing: str | None = None) -> WarmTransferStart:
        self.warm_transfers.append((target, summary))
        self.warm_briefings.append(briefing)
        return self.warm_start

    async def send_dtmf(self, digits: str) -> None:
        self.dtmf.append(digits)

    async def hold(self, held: bool) -> None:
        self.holds.append(held)


class FakeClock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# ------------------------------------------------------------------------------------------- helpers


def tone_frame(index: int, *, level: int = 0) -> Frame:
    """A frame whose samples identify it (index-dependent ramp), or a constant ``level`` if given."""
    if level:
        return Frame(index=index, pcm=np.full(FRAME_SAMPLES, level, dtype=np.int16))
    ramp = (np.arange(FRAME_SAMPLES, dtype=np.int64) + index * 997) % 2000 - 1000
    return Frame(index=index, pcm=ramp.astype(np.int16))


def pcm_ms(ms: int, *, seed: int = 1) -> bytes:
    """``ms`` of non-silent 24 kHz PCM16 agent audio (a deterministic pattern)."""
    samples = ms * 24
    values = (np.arange(samples, dtype=np.int64) * 31 + seed * 7) % 4000 - 2000
    values[values == 0] = 1
    return values.astype("<i2").tobytes()


def agent_audio(
    session: FakeRealtimeSession, *, response_id: str = "r1", item_id: str = "i1", ms: int, done: bool = True
) -> None:
    """A whole agent response: started, audio, done."""
    session.emit(ResponseStarted(response_id=response_id))
    session.emit(AudioReceived(response_id=response_id, item_id=item_id, pcm=pcm_ms(ms)))
    if done:
        session.emit(AudioDone(response_id=response_id, item_id=item_id))
        session.emit(ResponseDone(response_id=response_id, status="completed"))


def is_state(state: CallState) -> Callable[[SessionEvent], bool]:
    return lambda event: isinstance(event, StateChanged) and event.new is state


def of_type(event_type: type[SessionEvent], **fields: Any) -> Callable[[SessionEvent], bool]:
    return lambda event: isinstance(event, event_type) and all(getattr(event, k) == v for k, v in fields.items())


def fast_config(**overrides: Any) -> SessionConfig:
    """Test timings: quick backoff, short grace; everything else default unless overridden."""
    base: dict[str, Any] = {
        "resume_backoff_base_s": 0.001,
        "resume_backoff_max_s": 0.004,
        "tool_grace_s": 0.05,
        "close_timeout_s": 2.0,
    }
    base.update(overrides)
    return SessionConfig(**base)


def make_session(
    model: FakeModel,
    *,
    control: FakeCallControl | None = None,
    config: SessionConfig | None = None,
    profile: AgentProfile | None = None,
    tools: ToolRegistry | None = None,
    clock: Callable[[], float] | None = None,
    call_id: str = "c1",
    trace: CallTrace | None = None,
) -> tuple[CallSession, FakeCallControl]:
    control = control or FakeCallControl()
    session = CallSession(
        call_id=call_id,
        profile=profile or AgentProfile(name="agent"),
        model=model,
        control=control,
        config=config or fast_config(),
        tools=tools,
        clock=clock or FakeClock(),
        trace=trace,
    )
    return session, control


def call_tasks(call_id: str = "c1") -> list[asyncio.Task[Any]]:
    """Tasks of a call still alive (the session names all of its tasks ``call-<id>:...``)."""
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(f"call-{call_id}:") and not t.done()]


async def wait_event(session: CallSession, predicate: Callable[[SessionEvent], bool]) -> SessionEvent:
    record = await session.events.wait_for(predicate, timeout_s=DEADLINE)
    return record.event


async def drained(session: CallSession, fake: FakeRealtimeSession) -> None:
    """Wait until the session's listener has handled everything ``fake`` emitted so far (a marker notice)."""
    marker = f"marker-{session.events.last_id}-{len(fake.sent)}"
    fake.emit(ProviderNoticed(code=marker, message=""))
    await wait_event(session, of_type(NoticeReceived, code=marker))
