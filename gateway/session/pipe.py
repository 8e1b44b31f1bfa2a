"""The session's one way to the provider: the current connection (with its epoch), caller frames, control sends.

- Every provider connection of a call is a :class:`Link` with an epoch that grows by one per connection. Every
  send checks that its link is still the current, non-stale one right before awaiting it, so a refused or failed
  resume never sends to a stale connection.
- Caller frames enter one bounded FIFO (:meth:`ProviderPipe.push`), O(1) inside the media tick. While the
  session may send (ACTIVE), a complete chunk is written at once from the tick when the connection takes it
  without waiting (``send_audio_nowait``: one synchronous write, no task switch per call per frame); when it
  cannot (a send in progress, a full write buffer), one sender task drains the FIFO, batching queued frames
  into one send when it is behind. Otherwise (CONNECTING/RESUMING) frames are held in the same FIFO, in order.
  Overflow drops the oldest frame and counts it. A batch whose send fails goes back to the front to be
  flushed into the next connection.
- A caller who has been quiet for a while (listening to the agent) is sent in larger chunks: after
  ``quiet_after_frames`` quiet frames in a row (no sample at -36 dBFS or above), a chunk is
  ``quiet_chunk_frames``; the first frame that is not quiet goes out at once with what waited before it. The
  provider's turn detector has had its silence by then, and a barge-in is not held back.
- Everything else (cancel, truncate, tool outputs, text items, response requests) goes through one ordered
  queue with one task. An op is either bound to the epoch it was made for (a truncate names an item of that
  connection) or follows the call to whichever connection is current; the latter may ask to be retried on the
  next connection when its send fails.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

from gateway.providers.base import KeypadSession, RealtimeSession
from telcodecs.frames import Frame
from telcodecs.g711 import alaw_is_quiet, pcm_is_quiet, ulaw_is_quiet

log = logging.getLogger(__name__)


@dataclass(slots=True, kw_only=True, eq=False)
class Link:
    epoch: int
    session: RealtimeSession
    opened_at: float
    stale: bool = False
    closed: bool = False
    listener_task: asyncio.Task[None] | None = None


@dataclass(slots=True, kw_only=True, eq=False)
class SendOp:
    name: str
    send: Callable[[RealtimeSession], Awaitable[None]]
    epoch: int | None = None  # only for this connection; None: whichever connection is current
    retry: bool = False  # on a failed send, try again on the next connection
    min_epoch: int = 0
    on_sent: Callable[[int], None] | None = None
    on_dropped: Callable[[str], None] | None = None
    attempts: list[int] = field(default_factory=list)


def frame_is_quiet(frame: Frame) -> bool:
    """No sample of ``frame`` reaches -36 dBFS; judged on the caller's G.711 codes if it has them."""
    codes = frame.g711
    if codes is not None:
        return ulaw_is_quiet(codes) if frame.g711_law == "pcmu" else alaw_is_quiet(codes)
    return pcm_is_quiet(frame.pcm)


def _never() -> bool:
    return False


def _ignore_failure(link: Link, exc: BaseException) -> None:
    pass


class ProviderPipe:
    def __init__(
        self,
        *,
        hold_frames: int,
        chunk_frames: int,
        max_batch_frames: int,
        can_send: Callable[[], bool],
        on_send_failed: Callable[[Link, BaseException], None],
        quiet_chunk_frames: int | None = None,
        quiet_after_frames: int = 50,
    ) -> None:
        self._hold_frames = hold_frames
        self._chunk = chunk_frames  # the chunk now: _loud_chunk, or _quiet_chunk once the caller has been quiet
        self._loud_chunk = chunk_frames
        self._quiet_chunk = quiet_chunk_frames or chunk_frames
        self._quiet_after = quiet_after_frames
        self._quiet_run = 0
        self._max_batch = max_batch_frames
        self._can_send = can_send
        self._on_send_failed = on_send_failed
        # Converts a batch of caller frames into the provider's input format (G.711 profiles); None: PCM as is.
        self.encode: Callable[[list[Frame]], bytes] | None = None
        self.link: Link | None = None
        self.epoch = 0
        self._inbound: deque[Frame] = deque()
        self._inbound_wake = asyncio.Event()
        self._sending = False  # the sender task is awaiting a send: the tick must not overtake it
        self._unsent: tuple[list[Frame], bytes] | None = None  # a chunk the connection could not take at once
        self._ops: deque[SendOp] = deque()
        self._ops_wake = asyncio.Event()
        self.frames_sent = 0
        self.audio_sends = 0
        self.frames_held = 0
        self.frames_dropped = 0

    # ------------------------------------------------------------------------------------------ links

    def install(self, session: RealtimeSession, *, now: float) -> tuple[Link, Link | None]:
        """Make ``session`` the current connection; returns it and the previous link (now stale)."""
        old = self.retire()
        self.epoch += 1
        self.link = Link(epoch=self.epoch, session=session, opened_at=now)
        return self.link, old

    def retire(self) -> Link | None:
        """The current connection must not be sent to any more."""
        old, self.link = self.link, None
        if old is not None:
            old.stale = True
        return old

    def usable(self) -> Link | None:
        link = self.link
        return link if link is not None and not link.stale else None

    def wake(self) -> None:
        self._inbound_wake.set()
        self._ops_wake.set()

    # ---------------------------------------------------------------------------------------- inbound

    @property
    def queued_frames(self) -> int:
        return len(self._inbound)

    def push(self, frame: Frame, *, holding: bool) -> None:
        """Queue one caller frame (held while ``holding``, else :meth:`send_queued`). O(1)."""
        queue = self._inbound
        if len(queue) >= self._hold_frames:
            queue.popleft()
            self.frames_dropped += 1
        queue.append(frame)
        if self._quiet_chunk > self._loud_chunk:
            if frame_is_quiet(frame):
                self._quiet_run += 1
                if self._quiet_run >= self._quiet_after:
                    self._chunk = self._quiet_chunk
            else:
                self._quiet_run = 0
                self._chunk = self._loud_chunk
        if holding:
            self.frames_held += 1
        else:
            self.send_queued()

    def send_queued(self) -> None:
        """When a chunk is complete, send it now if the connection takes it without waiting; otherwise wake
        the sender task to send it."""
        queue = self._inbound
        if len(queue) < self._chunk:
            return
        if not self._sending and self._unsent is None and self._can_send():
            self._send_now()
        if (len(queue) >= self._chunk or self._unsent is not None) and not self._inbound_wake.is_set():
            self._inbound_wake.set()

    def _take(self) -> tuple[list[Frame], bytes]:
        """The next batch of whole chunks from the queue and its bytes in the provider's input format."""
        queue = self._inbound
        take = min(len(queue), self._max_batch)
        take -= take % self._chunk
        batch = [queue.popleft() for _ in range(take)]
        if self.encode is not None:
            return batch, self.encode(batch)
        return batch, b"".join([frame.to_bytes() for frame in batch])

    def _send_now(self) -> None:
        # The media tick's path: one synchronous write per chunk, no task switch. A chunk the connection cannot
        # take at once is kept as it is (already encoded: encoders keep state) for the sender task.
        link = self.usable()
        if link is None:
            return
        session = link.session
        while len(self._inbound) >= self._chunk:
            batch, pcm = self._take()
            try:
                sent = session.send_audio_nowait(pcm)
            except Exception as exc:
                self._requeue(batch)
                self._on_send_failed(link, exc)
                return
            if not sent:
                self._unsent = (batch, pcm)
                return
            self.frames_sent += len(batch)
            self.audio_sends += 1

    async def sender_loop(self) -> None:
        while True:
            self._inbound_wake.clear()
            await self._flush_inbound()
            await self._inbound_wake.wait()

    async def _flush_inbound(self) -> None:
        while self._can_send():
            link = self.usable()
            if link is None:
                return
            if self._unsent is not None:
                (batch, pcm), self._unsent = self._unsent, None
            elif len(self._inbound) >= self._chunk:
                batch, pcm = self._take()
            else:
                return
            self._sending = True
            try:
                await link.session.send_audio(pcm)
            except Exception as exc:
                self._requeue(batch)
                self._on_send_failed(link, exc)
                return
            finally:
                self._sending = False
            self.frames_sent += len(batch)
            self.audio_sends += 1

    def _requeue(self, batch: list[Frame]) -> None:
        room = self._hold_frames - len(self._inbound)
        if room < len(batch):
            # Keep the newest: drop the oldest of the returned batch.
            self.frames_dropped += len(batch) - max(room, 0)
            batch = batch[len(batch) - max(room, 0) :]
        self._inbound.extendleft(reversed(batch))

    # -------------------------------------------------------------------------------------------- ops

    def enqueue(self, op: SendOp) -> None:
        self._ops.append(op)
        self._ops_wake.set()

    async def control_loop(self) -> None:
        while True:
            self._ops_wake.clear()
            await self._run_ops()
            await self._ops_wake.wait()

    async def _run_ops(self) -> None:
        ops = self._ops
        while ops and self._can_send():
            link = self.usable()
            if link is None:
                return
            op = ops[0]
            if op.epoch is not None and op.epoch != link.epoch:
                ops.popleft()
                if op.on_dropped is not None:
                    op.on_dropped("connection replaced")
                continue
            if link.epoch < op.min_epoch:
                return
            ops.popleft()
            op.attempts.append(link.epoch)
            try:
                await op.send(link.session)
            except Exception as exc:
                if op.retry:
                    op.min_epoch = link.epoch + 1
                    ops.appendleft(op)
                elif op.on_dropped is not None:
                    op.on_dropped(f"send failed: {type(exc).__name__}")
                self._on_send_failed(link, exc)
                return
            if op.on_sent is not None:
                op.on_sent(link.epoch)

    def release(self) -> None:
        """The call has ended: drop the session's callbacks and the last link (reference cycles: ADR 0006)."""
        self._can_send = _never
        self._on_send_failed = _ignore_failure
        self.encode = None
        self.link = None

    def drain_ops(self) -> list[SendOp]:
        """At call end: every op that was never sent."""
        ops = list(self._ops)
        self._ops.clear()
        return ops

    def pending_ops(self) -> int:
        return len(self._ops)


# Provider sends as plain functions of the session they go to (bound with functools.partial into SendOps).


async def send_text(session: RealtimeSession, *, text: str, role: Literal["user", "system"]) -> None:
    await session.send_text(text, role=role)


async def send_dtmf(session: RealtimeSession, *, digit: str) -> None:
    if isinstance(session, KeypadSession):
        await session.send_dtmf(digit)


async def create_response(session: RealtimeSession, *, instructions: str | None) -> None:
    await session.create_response(instructions=instructions)


async def cancel_response(session: RealtimeSession) -> None:
    await session.cancel_response()


async def truncate_item(session: RealtimeSession, *, item_id: str, content_index: int, audio_end_ms: int) -> None:
    await session.truncate_item(item_id, content_index=content_index, audio_end_ms=audio_end_ms)


async def delete_item(session: RealtimeSession, *, item_id: str) -> None:
    await session.delete_item(item_id)


async def send_tool_result(session: RealtimeSession, *, call_id: str, output: str, name: str) -> None:
    await session.send_tool_result(call_id, output, name=name)
