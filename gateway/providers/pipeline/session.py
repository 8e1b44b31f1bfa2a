"""One call's cascaded agent behind the :class:`~gateway.providers.base.RealtimeSession` contract.

Caller audio goes synchronously to the voice detector and the recogniser (:meth:`PipelineSession.send_audio_nowait`
never awaits); the :class:`~.turns.TurnTaker` table decides turns and barge-ins; a reply streams the chat model's
text through the :class:`~.clauses.ClauseSplitter` into the TTS clause by clause (the first clause is spoken
before the model finishes) and the TTS audio out as :class:`AudioReceived`. The chat history lives here (the
model is stateless per request), seeded from ``history`` on connect, so the core's resume needs nothing more.

Truncation (PIPELINE.md §4.4): each reply's :class:`~.words.ItemSpeech` places its words on the item's audio
timeline; :meth:`truncate_item` keeps in the history, and reports to the core as the item's final transcript,
exactly the words whose audio started before ``audio_end_ms``. A reply cancelled before any audio leaves no trace.

Faults heal here first: a recogniser failure reconnects it (audio fed meanwhile is held, bounded, and replayed); a
TTS failure reopens a stream and speaks the rest of the item from the last word fully delivered; a chat failure
before any audio is retried once. A component still down after ``component_deadline_s`` ends the session with
``ProviderDisconnected(retryable=True)`` (a bad key: ``retryable=False``) and the core resumes as for any provider.

Tasks (all named, owned by the session, cancelled and awaited in :meth:`aclose`): the recogniser reader, the turn
timer, and per reply the generation task and the TTS reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.providers.base import (
    AgentProfile,
    AudioDone,
    AudioReceived,
    HistoryItem,
    ProviderDisconnected,
    ProviderErrored,
    ProviderEvent,
    ProviderNoticed,
    ResponseDone,
    ResponseStarted,
    SessionStarted,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
    TranscriptReceived,
)
from gateway.providers.errors import ProviderClosedError
from gateway.providers.pipeline._aio import Events, Resampler, quietly, wait_cancelled
from gateway.providers.pipeline.clauses import ClauseSplitter
from gateway.providers.pipeline.history import ChatHistory
from gateway.providers.pipeline.ports import (
    ChatMessage,
    ChatModel,
    ChatToolCall,
    LlmFailed,
    LlmFinished,
    SpeechToText,
    SttFailed,
    SttFinal,
    SttPartial,
    TextDelta,
    TextToSpeech,
    ToolCallDone,
    TtsAudio,
    TtsDone,
    TtsFailed,
    TtsStream,
    TtsWords,
    VoiceDetector,
)
from gateway.providers.pipeline.turns import TurnAction, TurnOptions, TurnTaker
from gateway.providers.pipeline.words import BYTES_PER_MS, ItemSpeech

log = logging.getLogger(__name__)

SttOpener = Callable[[], Awaitable[SpeechToText]]


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionOptions:
    turns: TurnOptions = field(default_factory=TurnOptions)
    component_deadline_s: float = 5.0  # a component down this long ends the session (retryable)
    event_queue_size: int = 2048  # events for the core; overflow is reported, never silent
    stt_hold_ms: int = 10_000  # caller audio held while the recogniser reconnects
    llm_retries: int = 1  # retries of a failed chat request that has not been heard yet
    kept_items: int = 16  # recent assistant items a truncate may still point at


@dataclass(slots=True)
class _Reply:
    response_id: str
    item_id: str
    speech: ItemSpeech
    stream: TtsStream | None = None
    tool_calls: list[ChatToolCall] = field(default_factory=list)
    flushed: bool = False
    tts_done: asyncio.Event = field(default_factory=asyncio.Event)
    first_audio_at: float | None = None
    task: asyncio.Task[None] | None = None
    reader: asyncio.Task[None] | None = None
    ended: bool = False


class PipelineSession:
    """See the module docstring and :class:`gateway.providers.base.RealtimeSession`."""

    def __init__(
        self,
        *,
        profile: AgentProfile,
        stt: SpeechToText,
        open_stt: SttOpener,
        chat: ChatModel,
        tts: TextToSpeech,
        vad: VoiceDetector,
        options: SessionOptions | None = None,
        history: Sequence[HistoryItem] = (),
        clock: Callable[[], float] | None = None,
        session_id: str = "pipeline",
    ) -> None:
        self.options = options or SessionOptions()
        self.profile = profile
        self.session_id = session_id
        self._stt = stt
        self._open_stt = open_stt
        self._chat = chat
        self._tts = tts
        self._vad = vad
        self._clock = clock or asyncio.get_running_loop().time
        self._started_at = self._clock()
        self._turns = TurnTaker(self.options.turns)
        self._events: asyncio.Queue[ProviderEvent] = asyncio.Queue(maxsize=self.options.event_queue_size)
        self._history = ChatHistory(history)
        self._items: OrderedDict[str, ItemSpeech] = OrderedDict()
        self._ids = itertools.count(1)
        self._user_item = ""
        self._reply: _Reply | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._armed: float | None = None
        self._stt_hold: deque[bytes] | None = None  # audio held while the recogniser reconnects
        self._stt_held_bytes = 0
        self._vad_rate = Resampler(vad.sample_rate)
        self._stt_rate = Resampler(stt.input_rate)
        self._window_ms = int(getattr(vad, "window_ms", 20))
        self._closed = False  # no more sends (closed by the client, or a component is down)
        self._ended = False  # ProviderDisconnected was queued
        self._released = False  # aclose() ran
        self.last_speech_at: float | None = None  # the caller's last speech window (latency figures)
        self.first_audio_at: float | None = None  # the last reply's first audio

    # ------------------------------------------------------------------------------------ life

    def start(self) -> None:
        self._emit(SessionStarted(session_id=self.session_id, resumed=False))
        self._spawn(self._read_stt(), "stt-reader")
        self._spawn(self._run_timer(), "turn-timer")

    async def aclose(self) -> None:
        """Stop every task and close the components. Idempotent; also after a component ended the session."""
        if self._released:
            return
        self._released = True
        self._closed = True
        await self._stop_reply(status="cancelled", emit=False)
        await self._cancel_tasks()
        for close in (self._stt.aclose, self._chat.aclose, self._tts.aclose):
            with contextlib.suppress(Exception):
                await close()
        self._finish(ProviderDisconnected(reason="closed by client", retryable=False))

    # ---------------------------------------------------------------------------------- sending

    async def send_audio(self, pcm: bytes) -> None:
        self.send_audio_nowait(pcm)

    def send_audio_nowait(self, pcm: bytes) -> bool:
        self._check_open()
        now = self._clock()
        vad_pcm = self._vad_rate.process(pcm)
        for activity in self._vad.feed(vad_pcm):
            if activity.speech:
                self.last_speech_at = now
            self._run(self._turns.vad(activity.speech, self._window_ms, self._ms(now)))
        stt_pcm = vad_pcm if self._stt_rate.rate == self._vad_rate.rate else self._stt_rate.process(pcm)
        self._feed_stt(stt_pcm)
        self._rearm()
        return True

    async def send_text(self, text: str, *, role: Literal["user", "system"] = "user") -> None:
        self._check_open()
        self._history.append(ChatMessage(role=role, content=text))

    async def create_response(self, *, instructions: str | None = None) -> None:
        self._check_open()
        if self._reply is not None and not self._reply.ended:
            return  # one reply at a time; the core coalesces its requests
        if self._turns.reply_requested(self._now_ms()):
            self._start_reply(instructions)

    async def cancel_response(self) -> None:
        self._check_open()
        await self._stop_reply(status="cancelled")

    async def truncate_item(self, item_id: str, *, content_index: int, audio_end_ms: int) -> None:
        self._check_open()
        speech = self._items.get(item_id)
        if speech is None:
            return
        if speech.estimated:
            self._emit(ProviderNoticed(code="alignment_estimated", message=f"{item_id}: word times estimated"))
        self._keep_heard(item_id, speech.heard(max(0, audio_end_ms)))

    async def delete_item(self, item_id: str) -> None:
        self._check_open()
        self._keep_heard(item_id, "")

    async def send_tool_result(self, call_id: str, output: str, *, name: str = "") -> None:
        self._check_open()
        self._history.append(ChatMessage(role="tool", tool_call_id=call_id, content=output, name=name))

    def events(self) -> AsyncIterator[ProviderEvent]:
        return Events(self._events)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def history(self) -> list[ChatMessage]:
        return self._history.messages()

    # ---------------------------------------------------------------------------------- turns

    def _run(self, actions: list[TurnAction]) -> None:
        for action in actions:
            if action.kind == "speech_started":
                # SpeechStarted first: the core stops playout and cancels this response as a barge-in; the reply's
                # own cancel (ResponseDone "cancelled") follows at once.
                self._user_item = f"user_{next(self._ids)}"
                self._emit(SpeechStarted(audio_start_ms=max(0, action.at_ms), item_id=self._user_item))
                if self._reply is not None and not self._reply.ended:
                    self._cancel_reply_now()
            elif action.kind == "finalize":
                if self._stt_hold is None:
                    self._stt.finalize()
            elif action.kind == "endpoint":
                self._emit(SpeechStopped(audio_end_ms=action.at_ms, item_id=self._user_item))
                self._emit(TranscriptReceived(role="user", item_id=self._user_item, text=action.text, final=True))
                self._history.drop(self._user_item)
                self._history.append(ChatMessage(role="user", content=action.text), item_id=self._user_item)
                self._start_reply(None)
            elif action.kind == "cancel_reply":
                # The caller went on before any agent audio: nothing was heard, the turn continues.
                self._cancel_reply_now()
                self._history.drop(self._user_item)
                self._emit(SpeechStarted(audio_start_ms=max(0, action.at_ms), item_id=self._user_item))
            elif action.kind == "discard":
                self._emit(SpeechStopped(audio_end_ms=action.at_ms, item_id=self._user_item))

    async def _run_timer(self) -> None:
        while True:
            deadline = self._turns.next_deadline()
            self._armed = None if deadline is None else self._started_at + deadline / 1000.0
            self._wake.clear()
            if self._armed is None:
                await self._wake.wait()
            else:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout_at(self._armed):
                        await self._wake.wait()
            self._run(self._turns.tick(self._now_ms()))

    def _rearm(self) -> None:
        deadline = self._turns.next_deadline()
        if deadline is None:
            return
        at = self._started_at + deadline / 1000.0
        if self._armed is None or at < self._armed:
            self._wake.set()

    # --------------------------------------------------------------------------------- replies

    def _start_reply(self, instructions: str | None) -> None:
        number = next(self._ids)
        reply = _Reply(
            response_id=f"resp_{number}", item_id=f"item_{number}", speech=ItemSpeech(item_id=f"item_{number}")
        )
        self._reply = reply
        self._emit(ResponseStarted(response_id=reply.response_id))
        reply.task = self._spawn(self._generate(reply, instructions), f"reply-{reply.response_id}")

    async def _generate(self, reply: _Reply, instructions: str | None) -> None:
        try:
            await self._generate_reply(reply, instructions)
        except Exception as exc:
            # A component broke its contract (raised instead of reporting): this reply fails, the call goes on.
            log.warning("pipeline %s: reply %s failed: %r", self.session_id, reply.response_id, exc)
            self._emit(ProviderErrored(code="reply_failed", message=f"{type(exc).__name__}: {exc}", fatal=False))
            if reply.stream is not None:
                await quietly(reply.stream.cancel())
            self._end_reply(reply, status="failed")

    async def _generate_reply(self, reply: _Reply, instructions: str | None) -> None:
        messages = self._messages(instructions)
        attempts = 0
        status = "completed"
        while True:
            failure = await self._stream_reply(reply, messages)
            if failure is None:
                break
            if failure.retryable and attempts < self.options.llm_retries and reply.speech.audio_bytes == 0:
                attempts += 1
                self._emit(ProviderNoticed(code="llm_retry", message=failure.message))
                await self._reset_reply(reply)
                continue
            self._emit(ProviderErrored(code="llm_failed", message=failure.message, fatal=False))
            status = "failed" if reply.speech.audio_bytes == 0 else "incomplete"
            break
        if reply.stream is not None:
            reply.flushed = True
            await reply.stream.flush()
            await reply.tts_done.wait()
        if status == "failed":
            self._end_reply(reply, status="failed")
            return
        self._complete(reply, status)

    async def _stream_reply(self, reply: _Reply, messages: list[ChatMessage]) -> LlmFailed | None:
        splitter = ClauseSplitter()
        stream = self._chat.stream(messages, self.profile.tools, model=self.profile.model)
        try:
            async for event in stream:
                if isinstance(event, TextDelta):
                    for clause in splitter.feed(event.text):
                        await self._speak(reply, clause)
                elif isinstance(event, ToolCallDone):
                    reply.tool_calls.append(event.call)
                elif isinstance(event, LlmFinished):
                    rest = splitter.flush()
                    if rest.strip():
                        await self._speak(reply, rest)
                    return None
                elif isinstance(event, LlmFailed):
                    return event
        finally:
            close = getattr(stream, "aclose", None)
            if close is not None:
                await close()
        return LlmFailed(message="the chat stream ended without finishing", retryable=True)

    async def _speak(self, reply: _Reply, clause: str) -> None:
        if reply.stream is None:
            await self._open_tts(reply, char_base=len(reply.speech.text))
        assert reply.stream is not None
        reply.speech.pushed(clause)
        self._emit(TranscriptReceived(role="assistant", item_id=reply.item_id, text=clause, final=False))
        await reply.stream.push(clause)

    async def _open_tts(self, reply: _Reply, *, char_base: int) -> None:
        stream = await self._within_deadline("tts", lambda: self._tts.open(reply.item_id, voice=self.profile.voice))
        reply.stream = stream
        reply.speech.begin_segment(char_base=char_base, timestamps=stream.timestamps)
        if reply.reader is None:
            reply.reader = self._spawn(self._read_tts(reply), f"tts-{reply.item_id}")

    async def _read_tts(self, reply: _Reply) -> None:
        try:
            await self._read_tts_streams(reply)
        finally:
            reply.tts_done.set()  # whatever ended the reading, the reply must not wait for it forever

    async def _read_tts_streams(self, reply: _Reply) -> None:
        while reply.stream is not None:
            stream = reply.stream
            async for event in stream.events():
                if isinstance(event, TtsAudio):
                    self._audio(reply, event.pcm)
                elif isinstance(event, TtsWords):
                    reply.speech.words_reported(event.words)
                elif isinstance(event, TtsDone):
                    reply.speech.segment_done()
                    reply.tts_done.set()
                    return
                elif isinstance(event, TtsFailed):
                    self._emit(ProviderNoticed(code="tts_failed", message=event.message))
                    if not event.retryable:
                        await self._component_down("tts", event.message, retryable=False)
                        return
                    await self._reopen_tts(reply)
                    break
            else:
                await self._reopen_tts(reply)  # the stream ended without TtsDone: treat as a drop

    async def _reopen_tts(self, reply: _Reply) -> None:
        """Speak the rest of the item on a new stream, from the last word whose audio fully arrived."""
        point = reply.speech.resume_point()
        stream = await self._within_deadline("tts", lambda: self._tts.open(reply.item_id, voice=self.profile.voice))
        reply.speech.begin_segment(char_base=point, timestamps=stream.timestamps)
        reply.stream = stream
        rest = reply.speech.text[point:]
        if rest.strip():
            await stream.push(rest)
        if reply.flushed:
            await stream.flush()

    def _audio(self, reply: _Reply, pcm: bytes) -> None:
        if not pcm:
            return
        now = self._clock()
        if reply.first_audio_at is None:
            reply.first_audio_at = now
            self.first_audio_at = now
        reply.speech.audio(len(pcm))
        self._emit(AudioReceived(response_id=reply.response_id, item_id=reply.item_id, content_index=0, pcm=pcm))
        self._turns.reply_audio(len(pcm) // BYTES_PER_MS, self._ms(now))
        self._rearm()

    def _complete(self, reply: _Reply, status: str) -> None:
        text = reply.speech.text.strip()
        if reply.first_audio_at is not None:
            self._emit(AudioDone(response_id=reply.response_id, item_id=reply.item_id))
        self._emit(TranscriptReceived(role="assistant", item_id=reply.item_id, text=text, final=True))
        if text or reply.tool_calls:
            message = ChatMessage(role="assistant", content=text, tool_calls=tuple(reply.tool_calls))
            self._history.append(message, item_id=reply.item_id)
        self._remember(reply)
        for call in reply.tool_calls:
            self._emit(ToolCallRequested(call_id=call.call_id, name=call.name, arguments=call.arguments))
        self._end_reply(reply, status=status)

    def _end_reply(self, reply: _Reply, *, status: str) -> None:
        if reply.ended:
            return
        reply.ended = True
        self._emit(ResponseDone(response_id=reply.response_id, status=status))
        self._run(self._turns.reply_ended(self._now_ms(), cancelled=status == "cancelled"))
        self._rearm()

    def _cancel_reply_now(self) -> None:
        """Barge-in or a silent cancel: stop generation and speech at once; what was heard stays (estimated until
        the core's truncate says exactly)."""
        reply = self._reply
        if reply is None or reply.ended:
            return
        for task in (reply.task, reply.reader):
            if task is not None and not task.done():
                task.cancel()
        stream = reply.stream
        if stream is not None:
            self._spawn(quietly(stream.cancel()), f"tts-cancel-{reply.item_id}")
        if reply.first_audio_at is not None:
            self._emit(AudioDone(response_id=reply.response_id, item_id=reply.item_id))
            heard_ms = int((self._clock() - reply.first_audio_at) * 1000)
            self._remember(reply)
            self._keep_heard(reply.item_id, reply.speech.heard(min(heard_ms, reply.speech.audio_ms)))
        else:
            self._emit(TranscriptReceived(role="assistant", item_id=reply.item_id, text="", final=True))
        self._end_reply(reply, status="cancelled")

    async def _stop_reply(self, *, status: str, emit: bool = True) -> None:
        reply = self._reply
        if reply is None or reply.ended:
            return
        if emit:
            self._cancel_reply_now()
        else:
            reply.ended = True
            for task in (reply.task, reply.reader):
                if task is not None:
                    task.cancel()
        for task in (reply.task, reply.reader):
            if task is not None:
                await wait_cancelled(task)

    async def _reset_reply(self, reply: _Reply) -> None:
        """Before a retry of the chat request: forget the text pushed to a TTS that has not spoken yet."""
        if reply.stream is not None:
            await quietly(reply.stream.cancel())
        if reply.reader is not None:
            await wait_cancelled(reply.reader)
        reply.stream, reply.reader = None, None
        reply.speech = ItemSpeech(item_id=reply.item_id)
        reply.tool_calls.clear()
        reply.tts_done = asyncio.Event()

    def _messages(self, instructions: str | None) -> list[ChatMessage]:
        return self._history.messages(system=self.profile.instructions, instructions=instructions)

    # ------------------------------------------------------------------------------ truncation

    def _remember(self, reply: _Reply) -> None:
        self._items[reply.item_id] = reply.speech
        while len(self._items) > self.options.kept_items:
            self._items.popitem(last=False)

    def _keep_heard(self, item_id: str, heard: str) -> None:
        """The item's message in the history becomes what the caller heard (removed when nothing was)."""
        self._history.set(item_id, ChatMessage(role="assistant", content=heard) if heard else None)
        self._emit(TranscriptReceived(role="assistant", item_id=item_id, text=heard, final=True))

    # ---------------------------------------------------------------------------------- faults

    def _feed_stt(self, pcm: bytes) -> None:
        if not pcm:
            return
        hold = self._stt_hold
        if hold is None:
            self._stt.feed(pcm)
            return
        hold.append(pcm)
        self._stt_held_bytes += len(pcm)
        limit = self.options.stt_hold_ms * self._stt_rate.rate * 2 // 1000
        if self._stt_held_bytes > limit:
            dropped = hold.popleft()
            self._stt_held_bytes -= len(dropped)
            self._emit(
                ProviderErrored(
                    code="stt_hold_overflow",
                    message="caller audio dropped while the recogniser reconnects",
                    fatal=False,
                )
            )

    async def _read_stt(self) -> None:
        while True:
            failure = "the recogniser's event stream ended"
            retryable = True
            async for event in self._stt.events():
                now = self._now_ms()
                if isinstance(event, SttPartial):
                    self._run(self._turns.stt_text(event.text, now))
                elif isinstance(event, SttFinal):
                    self._run(self._turns.stt_final(event.text, now))
                elif isinstance(event, SttFailed):
                    failure, retryable = event.message, event.retryable
                    break
                self._rearm()
            self._emit(ProviderNoticed(code="stt_failed", message=failure))
            if not retryable:
                await self._component_down("stt", failure, retryable=False)
                return
            self._stt_hold, self._stt_held_bytes = deque(), 0
            old = self._stt
            with contextlib.suppress(Exception):
                await old.aclose()
            self._stt = await self._within_deadline("stt", self._open_stt)
            held, self._stt_hold = self._stt_hold, None
            for pcm in held:
                self._stt.feed(pcm)
            self._stt_held_bytes = 0

    async def _within_deadline(self, component: str, open_: Callable[[], Awaitable[Any]]) -> Any:
        """Open a component, retrying with backoff until ``component_deadline_s``; then the session ends."""
        deadline = self._clock() + self.options.component_deadline_s
        delay = 0.05
        while True:
            try:
                return await open_()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                retryable = getattr(exc, "retryable", True)
                if not retryable or self._clock() + delay >= deadline:
                    await self._component_down(component, f"{type(exc).__name__}: {exc}", retryable=bool(retryable))
                    raise
                log.info("pipeline %s: %s failed to open (%s); retrying", self.session_id, component, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _component_down(self, component: str, message: str, *, retryable: bool) -> None:
        """A component stays down: the session ends and the core resumes (or ends the call when not retryable)."""
        self._emit(ProviderErrored(code=f"{component}_down", message=message, fatal=True))
        self._finish(ProviderDisconnected(reason=f"{component} unavailable: {message}", retryable=retryable))
        self._closed = True
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:
                task.cancel()

    # ------------------------------------------------------------------------------- plumbing

    def _emit(self, event: ProviderEvent) -> None:
        if self._ended:
            return
        try:
            self._events.put_nowait(event)
        except asyncio.QueueFull:
            # The core stopped reading: say so and end, rather than lose events silently.
            self._finish(ProviderDisconnected(reason="event queue overflow (the reader fell behind)", retryable=True))
            self._closed = True

    def _finish(self, event: ProviderDisconnected) -> None:
        if self._ended:
            return
        self._ended = True
        while self._events.full():
            self._events.get_nowait()
        self._events.put_nowait(event)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=f"pipeline-{self.session_id}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not self._ended:
            log.warning("pipeline %s: task %s failed: %r", self.session_id, task.get_name(), exc)
            self._emit(ProviderErrored(code="internal_error", message=f"{task.get_name()}: {exc!r}", fatal=False))

    async def _cancel_tasks(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            await wait_cancelled(task)

    def _check_open(self) -> None:
        if self._closed:
            raise ProviderClosedError("pipeline session is closed", retryable=True)

    def _now_ms(self) -> int:
        return self._ms(self._clock())

    def _ms(self, at: float) -> int:
        return int((at - self._started_at) * 1000)
