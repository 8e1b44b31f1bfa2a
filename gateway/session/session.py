"""CallSession: one per call, between the media tick and a realtime provider; owns everything the call uses.

Owned (via :class:`~gateway.session.tasks.TaskOwner`): the provider connections and their listener tasks
(:mod:`gateway.session.connections`), the inbound sender and ordered provider-send tasks
(:mod:`gateway.session.pipe`), tool tasks and grace timers (:mod:`gateway.session.toolrunner`), resume, rotation
and ending tasks, and every waiter. :meth:`CallSession.aclose` is idempotent and safe from any task, a tool's own
included: teardown runs in a separate closer task that every caller awaits shielded; it cancels and awaits every
task, closes the provider, wakes every waiter and records why the call ended. An exception in a background task
becomes an ErrorOccurred event; CancelledError is never swallowed. States: :mod:`gateway.session.state`.

Media tick contract (synchronous, O(1)): :meth:`push_inbound` once per tick with the caller frame,
:meth:`pull_outbound` exactly once per tick (the frame returned is what the caller hears; agent audio is counted
as sent here), :meth:`dtmf_received` per digit. The tick sends its RTP before it pushes, so the provider writes
that a push makes never delay the caller's audio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from types import TracebackType
from typing import Any, Literal, overload

from gateway.compiled import caused
from gateway.media.amd_words import WordsConfig
from gateway.media.tick import G711Frame
from gateway.providers.base import (
    AgentProfile,
    AudioDone,
    AudioMarked,
    AudioReceived,
    ConnectionExpiring,
    KeypadSession,
    ProviderDisconnected,
    ProviderErrored,
    ProviderEvent,
    ProviderNoticed,
    RealtimeModel,
    RealtimeSession,
    ResponseDone,
    ResponseInterrupted,
    ResponseStarted,
    ResumeHandleUpdated,
    SpeechStarted,
    SpeechStopped,
    ToolCallRequested,
    ToolCallsCancelled,
    TranscriptReceived,
)
from gateway.providers.errors import ProviderError
from gateway.session.amd_gate import VOICEMAIL_LEFT, AmdAction, AmdGate, AmdPolicy, AmdReport
from gateway.session.amd_listen import AmdListener, GreetingTranscribing, words_source
from gateway.session.calltrace import SessionTrace
from gateway.session.config import SessionConfig, WebhookToolConfig
from gateway.session.connections import Connections
from gateway.session.control import CallControl
from gateway.session.errors import (
    HandoffError,
    HandoffRefusedError,
    ProfileUpdateError,
    SessionStartError,
    SessionStateError,
)
from gateway.session.events import (
    AmdDetected,
    BargedIn,
    CallHeld,
    CallResumed,
    DtmfReceived,
    ErrorOccurred,
    EventRing,
    GuardrailTripped,
    HandedOff,
    HandoffFailed,
    HandoffStarted,
    NoInputPrompted,
    NoticeReceived,
    ProfileUpdated,
    ProfileUpdateFailed,
    ResumeAttemptFailed,
    Resumed,
    ResumeFailed,
    ResumeStarted,
    SessionEnded,
    SessionEvent,
    StateChanged,
    TranscriptUpdated,
    VoicemailBeepHeard,
)
from gateway.session.g711 import G711Playback, G711Transcoder
from gateway.session.guardrails import Guardrails, Trip, tripped_event
from gateway.session.handoff import (
    HandoffInitiator,
    HandoffLine,
    HandoffObserver,
    Handoffs,
    HandoffTarget,
    HandoffTargets,
    NoHandoffTargets,
    PendingHandoff,
    handoff_output,
)
from gateway.session.hold import HOLD_NOTE, RESUME_NOTE, HoldBy, HoldState
from gateway.session.host import SessionToolHost
from gateway.session.noinput import NoInputPolicy, NoInputTimer
from gateway.session.pipe import (
    Link,
    ProviderPipe,
    SendOp,
    cancel_response,
    create_response,
    delete_item,
    send_dtmf,
    send_text,
    truncate_item,
)
from gateway.session.playout import G711Codes
from gateway.session.rotation import RotationPlan
from gateway.session.state import CallState, check_transition
from gateway.session.stats import SessionStats, snapshot
from gateway.session.tasks import TaskOwner
from gateway.session.toolrunner import ToolRunner
from gateway.session.tools import ToolRegistry
from gateway.session.transcript import DtmfEntry, DtmfMethod, Transcript, TranscriptEntry
from gateway.session.turns import Cut, LatencyObserver, Turns
from gateway.tracing import CallTrace
from telcodecs.frames import Frame, unchecked_frame

log = logging.getLogger(__name__)

_DTMF = frozenset("0123456789*#ABCD")
_TRIPS_KEPT = 50
# A voicemail message is the whole point of the call: it gets far longer to play than a goodbye does.
_VOICEMAIL_TIMEOUT_S = 90.0
ResumeCause = Literal["dropped", "errored", "expiring", "rotation"]


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class CallSession:
    def __init__(
        self,
        *,
        call_id: str,
        profile: AgentProfile,
        model: RealtimeModel,
        control: CallControl,
        config: SessionConfig,
        tools: ToolRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_latency: LatencyObserver | None = None,
        handoffs: HandoffTargets | None = None,
        on_handoff: HandoffObserver | None = None,
        trace: CallTrace | None = None,
        on_guardrail_tripped: Callable[[GuardrailTripped], object] | None = None,
        amd: AmdPolicy | None = None,
        on_amd: Callable[[AmdReport], object] | None = None,
        amd_recognisers: GreetingTranscribing | None = None,
    ) -> None:
        self.call_id = call_id
        # The call's trace (gateway/tracing.py); None: no instrumentation at all (the bench's baseline).
        self._trace = SessionTrace(trace, provider=model.name) if trace is not None else None
        if self._trace is not None:
            on_latency = _traced_latency(on_latency, self._trace)
        self._profile = profile
        self._provider_profile = profile
        self._model = model
        self._caps = model.capabilities
        self._control = control
        self._config = config
        self._clock = clock
        self._owns_registry = tools is None
        self._registry = tools if tools is not None else ToolRegistry.from_config(config)
        self._handoffs = Handoffs(
            registry=self._registry,
            targets=handoffs or NoHandoffTargets(),
            config=config,
            owns_registries=tools is None,
        )
        self._handoffs.perform = self._agent_handoff
        if on_handoff is not None:
            self._handoffs.observer = on_handoff
        self._handoffs.adopt(profile, self._registry)
        self._state = CallState.CONNECTING
        self._end_reason: str | None = None
        self._hang_up_reason: str | None = None
        self._events = EventRing(config.event_ring_size, clock)
        self._transcript = Transcript(clock)
        self._turns = Turns(config, server_vad=self._caps.server_vad, clock=clock, on_latency=on_latency)
        self._tasks = TaskOwner(
            prefix=f"call-{call_id}",
            on_error=self._error,
            on_critical=partial(self._end_call, "internal_error"),
        )
        self._pipe = ProviderPipe(
            hold_frames=config.hold_frames,
            chunk_frames=config.inbound_chunk_ms // 20,
            quiet_chunk_frames=config.quiet_chunk_frames if self._caps.quiet_chunks else None,
            quiet_after_frames=config.inbound_quiet_after_ms // 20,
            max_batch_frames=config.inbound_max_batch_ms // 20,
            can_send=lambda: self._state is CallState.ACTIVE,
            on_send_failed=self._on_send_failed,
        )
        self._connections = Connections(
            model=model,
            config=config,
            pipe=self._pipe,
            tasks=self._tasks,
            clock=clock,
            on_error=self._error,
            listen=self._listen,
        )
        host = SessionToolHost(
            session_id=call_id,
            control=control,
            tasks=self._tasks,
            pipe=self._pipe,
            transcript=self._transcript,
            events=self._events,
            clock=clock,
            request_response=self._request_response,
            agent_quiet=lambda: self._turns.agent_quiet,
            end_call=self._end_call,
            retired_output=self._handoffs.retired_output,
            retired_role=config.background_result_role,
            observe=self._trace.on_event if self._trace is not None else None,
        )
        self._host = host
        self._tools = ToolRunner(host, self._handoffs, config, trace=trace)
        self._guardrails = Guardrails(
            config.guardrails,
            every_chars=config.guardrail_every_chars,
            call_id=call_id,
            tasks=self._tasks,
            clock=clock,
            on_trip=self._guardrail_tripped,
            on_error=self._error,
        )
        self._trips_pending: list[tuple[Trip, Cut | None, bool]] = []  # recorded by the next tick (its time, index)
        self._followed_up = False  # a follow-up was asked for since the caller last spoke
        self._trip_log: deque[tuple[float, GuardrailTripped]] = deque(maxlen=_TRIPS_KEPT)  # (at, event)
        self._on_guardrail_tripped = on_guardrail_tripped
        self._g711: G711Transcoder | None = None  # set per connection for G.711 profiles (_install)
        self._g711_playback: G711Playback | None = None  # made when a PCM caller is first sent provider codes
        self._close_task: asyncio.Task[None] | None = None
        self._switch_task: asyncio.Task[None] | None = None
        self._start_called = False
        self._updating = False
        self._ended = asyncio.Event()
        self._resume_handle: str | None = None
        self._handle_resumable = False
        self._rotation = RotationPlan(config, max_connection_s=self._caps.max_connection_s)
        self._deadline = float("inf")
        self._started_at = clock()
        self._out_index = 0
        self._hold = HoldState(config.hold_audio)
        self._no_input = self._no_input_timer(profile)
        # Outbound answering-machine detection: while open, callee frames go to it, not the provider (amd_gate.py).
        # With a recogniser on the side (the profile's amd_stt, or the provider's), words refine it (amd_listen.py).
        self._amd_words = words_source(model, profile, amd_recognisers, call_id=call_id) if amd is not None else None
        words = WordsConfig() if self._amd_words is not None else None
        self._amd: AmdGate | None = AmdGate(amd, words=words) if amd is not None else None
        self._amd_listener: AmdListener | None = None
        self._amd_listening: asyncio.Task[Any] | None = None
        self._on_amd = on_amd
        self._amd_told = False
        self._counts = dict.fromkeys(
            (
                "frames_in",
                "frames_out",
                "barge_ins",
                "resumes",
                "rotations",
                "resume_failures",
                "dtmf",
                "notices",
                "handoffs",
            ),
            0,
        )
        self._errors = 0

    # ------------------------------------------------------------------------------------ public view

    @property
    def state(self) -> CallState:
        return self._state

    @property
    def end_reason(self) -> str | None:
        return self._end_reason

    @property
    def events(self) -> EventRing:
        return self._events

    @property
    def transcript(self) -> tuple[TranscriptEntry, ...]:
        return self._transcript.entries()

    @property
    def started_at(self) -> float:
        """When the session started, on its clock (the one its transcript entries' ``at`` is read from)."""
        return self._started_at

    @property
    def profile(self) -> AgentProfile:
        return self._profile

    @property
    def handoff_lines(self) -> tuple[HandoffLine, ...]:
        """The call's handoffs so far, failed ones included (``handoffs`` counts them)."""
        return tuple(self._handoffs.lines)

    @property
    def guardrail_trips(self) -> tuple[tuple[float, GuardrailTripped], ...]:
        """The guardrail trips of the call (the last few), each with the session clock when it was recorded."""
        return tuple(self._trip_log)

    @property
    def agent_audio_gaps(self) -> int:
        """Times the agent's audio ran out while its item was still arriving (exported live as a metric)."""
        return self._turns.audio_gaps

    def stats(self) -> SessionStats:
        return snapshot(
            state=self._state.value,
            duration_s=self._clock() - self._started_at,
            counts=self._counts,
            errors=self._errors,
            pipe=self._pipe,
            tools=self._tools,
            round_trips=self._turns.round_trips,
            agent_audio_gaps=self._turns.audio_gaps,
        )

    async def wait_ended(self) -> str | None:
        """Wait until the call has ENDED; returns the end reason."""
        await self._ended.wait()
        return self._end_reason

    # -------------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Connect and become ACTIVE. On failure everything acquired is released and SessionStartError raised."""
        if self._start_called or self._tasks.closing:
            raise SessionStateError("start() can be called once, before the session is closed")
        self._start_called = True
        self._started_at = self._clock()
        self._deadline = self._started_at + self._profile.max_duration_s
        failure: BaseException | None = None
        closed_by_other = False
        try:
            self._tasks.spawn(self._pipe.sender_loop(), name="inbound-sender", critical=True)
            self._tasks.spawn(self._pipe.control_loop(), name="provider-sends", critical=True)
            self._provider_profile = self._for_provider(self._profile)
            if self._amd is not None and self._amd_words is not None:
                self._amd_listen(self._amd_words)  # opens while the agent connects: the greeting starts now
            link = self._install(await self._connect_at_start())
            if self._profile.greeting and self._amd is None:  # with AMD on, the greeting waits for a human
                self._turns.want_response(None)
                greeting = self._config.greeting_template.format(greeting=self._profile.greeting)
                await link.session.create_response(instructions=greeting)
            if link.stale:
                raise SessionStartError("the provider connection was lost during start", reason="provider_unavailable")
            self._transition(CallState.ACTIVE, "connected")
            self._pipe.wake()
        except BaseException as exc:
            failure = exc
            closed_by_other = self._tasks.closing
        if failure is None:
            return
        # Closed outside the except block: a compiled (mypyc) coroutine suspended inside one leaves its exception
        # as the thread's current one, and a later bare `raise` or `finally` elsewhere re-raises it.
        reason = _start_failure_reason(failure)
        await asyncio.shield(self._begin_close(reason, hang_up=False))
        if isinstance(failure, SessionStartError | asyncio.CancelledError):
            raise failure
        if closed_by_other:
            closed = SessionStartError("the call was closed during start", reason=self._end_reason or reason)
            raise caused(closed, failure)
        raise caused(SessionStartError(f"call entry failed: {_describe(failure)}", reason=reason), failure)

    async def aclose(self, reason: str = "closed") -> None:
        """End the call (idempotent, safe from any task). The first reason given is the one recorded."""
        await asyncio.shield(self._begin_close(reason, hang_up=False))

    async def __aenter__(self) -> CallSession:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose("closed" if exc is None else f"error: {type(exc).__name__}")

    async def update_profile(
        self, profile: AgentProfile, *, webhook_tools: tuple[WebhookToolConfig, ...] | None = None
    ) -> None:
        """Move the call to another agent profile on a fresh connection that carries the transcript.

        All or nothing: if resolving tools or connecting fails, or the call changes state meanwhile, the call keeps
        its previous profile and connection, and ProfileUpdateError is raised. ``webhook_tools``: the webhook tools
        the profile's tools name (a registry of their own); None keeps the current agent's.
        """
        self._require_switchable("update the profile")
        try:
            handoffs = self._handoffs
            registry = handoffs.registry if webhook_tools is None else handoffs.registry_for(webhook_tools)
            link = await self._replace_agent(profile, self._model, registry, note=self._resume_instruction(profile))
        except Exception as exc:
            self._record(ProfileUpdateFailed(name=profile.name, error=_describe(exc)))
            failed = ProfileUpdateError(f"profile update to {profile.name!r} failed: {_describe(exc)}")
            raise caused(failed, exc)  # noqa: B904 (caused(): see gateway.compiled)
        self._record(ProfileUpdated(name=profile.name, epoch=link.epoch))

    async def hand_off(
        self, target: HandoffTarget, *, reason: str = "", initiator: HandoffInitiator = "api", tool_call_id: str = ""
    ) -> None:
        """Hand the call to another agent profile (gateway/session/handoff.py): its provider, instructions, voice
        and tools, on a fresh connection that carries the conversation. All or nothing: on failure the current
        agent keeps the call and HandoffError is raised."""
        self._require_switchable("hand off")
        handoffs = self._handoffs
        calls = [e.call_id for e in self._transcript.entries() if e.kind == "function_call"]
        pending = handoffs.prepare(
            calls,
            from_profile=self._profile.name,
            target=target.profile,
            reason=reason,
            initiator=initiator,
            call_id=tool_call_id,
        )
        self._handoff_event(pending.started())
        began = self._clock()
        try:
            registry = handoffs.registry_for(target.webhook_tools)
            link = await self._replace_agent(
                target.profile, target.model, registry, note=pending.note, pending=pending, targets=target.targets
            )
        except Exception as exc:
            error = _describe(exc)
            handoffs.record(pending.line(self._elapsed(), error=error))
            self._handoff_event(pending.failed(error))
            log.warning("call %s: handoff %s -> %s failed: %s", self.call_id, *pending.names, error)
            failed = HandoffError(f"handoff to {pending.to_profile!r} failed: {error}")
            raise caused(failed, exc)  # noqa: B904 (caused(): see gateway.compiled)
        self._transcript.message("system", pending.note)  # later resumes replay it too
        handoffs.record(pending.line(self._elapsed()))
        self._handoff_event(pending.handed_off(link.epoch))
        took_ms = round((self._clock() - began) * 1000)
        log.info("call %s: handed off %s -> %s (%s) in %d ms", self.call_id, *pending.names, pending.initiator, took_ms)
        self._request_response()  # the new agent takes the conversation up

    async def _agent_handoff(self, name: str, reason: str, call_id: str) -> str:
        """The ``transfer_to_<name>`` tool: its output is what the old agent hears when the handoff fails."""
        try:
            target = self._handoffs.targets.resolve(name)
            if name not in self._profile.handoffs:
                raise HandoffRefusedError(f"profile {self._profile.name!r} may not hand off to {name!r}")
            await self.hand_off(target, reason=reason, initiator="agent", tool_call_id=call_id)
        except (HandoffError, SessionStateError) as exc:
            return handoff_output(ok=False, target=name, error=str(exc))
        return handoff_output(ok=True, target=name)

    def _handoff_event(self, event: HandoffStarted | HandedOff | HandoffFailed) -> None:
        self._record(event)
        if isinstance(event, HandoffStarted):
            self.handoff_started(target=event.to_profile, source=event.from_profile)
        else:
            self.handoff_ended(ok=isinstance(event, HandedOff), error=getattr(event, "error", ""))
        try:
            self._handoffs.observer(event)
        except Exception as exc:
            self._error("handoff observer", exc)

    def _require_switchable(self, what: str) -> None:
        if self._state is not CallState.ACTIVE or self._switch_task is not None:
            raise SessionStateError(f"cannot {what} while {self._state.value}")
        if self._updating:
            raise SessionStateError(f"cannot {what} while another change of agent is under way")

    async def _replace_agent(
        self,
        profile: AgentProfile,
        model: RealtimeModel,
        registry: ToolRegistry,
        *,
        note: str,
        pending: PendingHandoff | None = None,
        targets: HandoffTargets | None = None,
    ) -> Link:
        """Connect ``profile`` on ``model`` with the replayed transcript while the current agent keeps the call,
        then make it current. Raises (the current agent stays) when anything fails or the call changes state."""
        self._require_switchable("switch the agent")
        self._updating = True
        try:
            provider_profile = replace(profile, tools=self._handoffs.tools_for(profile, registry), resume_note="")
            history = self._handoffs.replay(self._transcript.history(resume_instruction=note), pending)
            session = await self._connections.connect_owned(provider_profile, history=history, model=model)
            if self._state is not CallState.ACTIVE or self._switch_task is not None or self._tasks.closing:
                await self._connections.close_session(session)
                raise SessionStateError(f"the call became {self._state.value} meanwhile")
            if pending is not None:
                self._handoffs.commit(pending)
            if model is not self._model:
                self._model, self._caps = model, model.capabilities
                self._connections.use_model(model)
                self._rotation = RotationPlan(self._config, max_connection_s=self._caps.max_connection_s)
                self._resume_handle, self._handle_resumable = None, False
            self._handoffs.adopt(profile, registry, targets)
            self._profile, self._provider_profile = profile, provider_profile
            link = self._install(session)
            self._pipe.wake()
            return link
        finally:
            self._updating = False

    # ------------------------------------------------------------------------------- live call control

    def say(self, text: str, *, interrupt: bool = False) -> None:
        """The agent says ``text``: once its current response is done, or at once when ``interrupt`` (what it was
        saying is cut and truncated like a barge-in). SessionStateError unless the call is ACTIVE."""
        self._require_active("say")
        if interrupt:
            self._barge_in("api")
        self._request_response(f"Say exactly this, then stop: {text}")

    def inject(self, text: str, *, role: Literal["user", "system"], respond: bool = False) -> None:
        """Add a message to the conversation (kept in the transcript, so a resume replays it); ``respond`` asks
        the agent to answer it. SessionStateError unless the call is ACTIVE."""
        link = self._require_active("inject")
        self._transcript.message(role, text)
        self._pipe.enqueue(SendOp(name="inject", send=partial(send_text, text=text, role=role), epoch=link.epoch))
        if respond:
            self._request_response()

    def _require_active(self, what: str) -> Link:
        link = self._pipe.usable()
        if self._state is not CallState.ACTIVE or link is None or self._close_task is not None:
            raise SessionStateError(f"cannot {what} while the call is {self._state.value}")
        return link

    # ------------------------------------------------------------------------------------ media tick

    def push_inbound(self, frame: Frame) -> None:
        """One caller frame (24 kHz, 20 ms): to the provider while ACTIVE, held in order while (re)connecting."""
        self._counts["frames_in"] += 1
        state = self._state
        if state is CallState.ENDING or state is CallState.ENDED or self._hold.held:
            return  # on hold the caller hears nothing and sends, at most, their hold music
        amd = self._amd
        if amd is not None and amd.open:
            self._amd_feed(amd, frame)
            return  # until AMD decides, nothing of the callee reaches the provider
        vad = self._turns.vad
        if vad is not None:
            change = vad.feed(frame.pcm)
            if change == "started":
                self._caller_started("local_vad", item_id="")
            elif change == "stopped":
                self._turns.caller_stopped()
                self._transcript.ended("user")
        self._pipe.push(frame, holding=state is not CallState.ACTIVE)

    @overload
    def pull_outbound(self) -> Frame | None: ...

    @overload
    def pull_outbound(self, *, takes_g711: bool) -> Frame | G711Frame | None: ...

    def pull_outbound(self, *, takes_g711: bool = False) -> Frame | G711Frame | None:
        """The frame the caller hears this tick (None = silence); agent audio is counted as sent here.

        ``takes_g711``: the caller's codec is G.711 (the media tick encodes what it is sent). The provider's
        G.711 audio then comes as a :class:`~gateway.media.tick.G711Frame`, the provider's codes and no PCM;
        without it, as a ``Frame`` of 24 kHz PCM made from the codes (which it also carries)."""
        index = self._out_index
        self._out_index += 1
        state = self._state
        if state is CallState.ENDING or state is CallState.ENDED:
            return None
        now = self._clock()
        if self._trips_pending:
            self._record_trips(now, index)
        if now >= self._rotation.next_at:
            self._maybe_rotate(now)
        if now >= self._deadline:
            self._deadline = float("inf")
            self._tasks.spawn(self._end_at_max_duration(), name="end:max-duration")
        if self._hold.held:  # playout paused: nothing is taken, so nothing is counted as sent
            hold_audio = self._hold.frame()
            return None if hold_audio is None else unchecked_frame(index, hold_audio)
        if self._no_input is not None and state is CallState.ACTIVE and (self._amd is None or not self._amd.open):
            self._check_no_input(now)  # not while AMD listens: the callee owes no answer yet
        audio, drained = self._turns.next_frame(now, index=index, resuming=state is CallState.RESUMING)
        if drained:
            self._tasks.pulse()
            if not self._turns.playout.starved:  # played out, not a gap: the agent's items ended now
                self._transcript.ended("assistant")
        if audio is None:
            if self._tools.has_ready and state is CallState.ACTIVE and self._idle(now):
                self._tools.on_idle()
            return None
        self._counts["frames_out"] += 1
        if self._turns.playout.markers_due:
            self._report_markers()
        # The playout's frames are 960-byte slices read as int16 and the playback's are whole resampled frames:
        # the frame contract holds by construction, so they skip the checks.
        if not isinstance(audio, G711Codes):
            return unchecked_frame(index, audio)
        codes, law = audio.codes, audio.law
        if takes_g711:
            return G711Frame(index=index, g711=codes, g711_law=law)
        playback = self._g711_playback
        if playback is None:
            playback = self._g711_playback = G711Playback()
        return unchecked_frame(index, playback.pcm(codes, law, index=index), codes, law)

    def dtmf_received(self, digit: str, *, duration_ms: int = 0) -> None:
        """A caller keypress: recorded, and forwarded to the agent as a text item when configured."""
        state = self._state
        if state is CallState.ENDING or state is CallState.ENDED:
            return
        digit = digit.upper()
        if len(digit) != 1 or digit not in _DTMF:
            self._record(NoticeReceived(code="invalid_dtmf", message=f"ignored DTMF {digit!r}"))
            return
        self._counts["dtmf"] += 1
        if self._no_input is not None:
            self._no_input.caller_spoke()
        forwarded = self._config.forward_dtmf
        if forwarded:
            text = self._config.dtmf_template.format(digit=digit)
            # In the transcript at once, so a (re)connect replays it; sent live only on the current connection.
            self._transcript.message("user", text)
            link = self._pipe.usable()
            if state is CallState.ACTIVE and link is not None:
                if isinstance(link.session, KeypadSession):  # a keypress, as such (the websocket provider)
                    self._pipe.enqueue(SendOp(name="dtmf", send=partial(send_dtmf, digit=digit), epoch=link.epoch))
                else:
                    send = partial(send_text, text=text, role="user")
                    self._pipe.enqueue(SendOp(name="dtmf", send=send, epoch=link.epoch))
                    if self._config.dtmf_requests_response:
                        self._request_response()
        self._transcript.dtmf(digit, "received")
        self._record(DtmfReceived(digit=digit, duration_ms=duration_ms, forwarded=forwarded))

    def dtmf_sent(self, digits: str, *, method: DtmfMethod | None = None) -> None:
        """Digits the call sent to the caller and how (RFC 4733, SIP INFO, in-band tones, a browser's)."""
        self._transcript.dtmf(digits, "sent", method=method)

    @property
    def dtmf_log(self) -> tuple[DtmfEntry, ...]:
        return self._transcript.dtmf_log()

    # The hook for agent handoffs (agent.handoff_started, then agent.handed_off or agent.handoff_failed): whoever
    # hands the call to another agent calls these, and the handoff is counted and traced.

    def handoff_started(self, *, target: str, source: str = "") -> None:
        self._counts["handoffs"] += 1
        if self._trace is not None:
            self._trace.handoff_started(target=target, source=source)

    def handoff_ended(self, *, ok: bool, error: str = "") -> None:
        if self._trace is not None:
            self._trace.handoff_ended(ok=ok, error=error)

    @property
    def handoffs(self) -> int:
        return self._counts["handoffs"]

    # ------------------------------------------------------------------------------- provider events

    async def _listen(self, link: Link) -> None:
        reason, retryable = "the provider's event stream ended", True
        try:
            async for event in link.session.events():
                if link.stale:
                    return
                if isinstance(event, ProviderDisconnected):
                    reason, retryable = event.reason, event.retryable
                    break
                try:
                    self._dispatch(link, event)
                except Exception as exc:
                    self._error(f"handling {type(event).__name__}", exc)
        except Exception as exc:
            self._error("provider listener", exc)
            reason = _describe(exc)
            retryable = exc.retryable if isinstance(exc, ProviderError) else True
        self._link_lost(link, reason, retryable=retryable, cause="dropped")

    def _dispatch(self, link: Link, event: ProviderEvent) -> None:
        turns = self._turns
        if isinstance(event, AudioReceived):
            turns.audio(event, law=None if self._g711 is None else self._g711.law)  # codes stay codes
            # The agent's item takes its place (and start) in the transcript with its first audio: a barge-in can
            # then mark it cut even when its words come later, or never.
            self._transcript.placeholder("assistant", event.item_id)
        elif isinstance(event, AudioDone):
            turns.audio_done(event)
        elif isinstance(event, AudioMarked):
            turns.playout.mark(event)
            if turns.playout.markers_due:
                self._report_markers()
        elif isinstance(event, SpeechStarted):
            self._caller_started("speech_started", item_id=event.item_id)
        elif isinstance(event, SpeechStopped):
            turns.caller_stopped()
            self._transcript.ended("user", event.item_id)
        elif isinstance(event, ResponseStarted):
            turns.response_started(event.response_id)
        elif isinstance(event, ResponseDone):
            wanted = turns.response_done(event.response_id)
            if wanted is not None:
                self._request_response(wanted[0])
            self._tasks.pulse()
        elif isinstance(event, TranscriptReceived):
            if event.role == "assistant" and self._guardrails.enabled:
                response_id = turns.active_response
                self._guardrails.feed(
                    response_id=response_id, item_id=event.item_id, text=event.text, final=event.final
                )
            self._transcript.speech(event.role, event.item_id, event.text, final=event.final)
            if event.final:
                self._record(TranscriptUpdated(role=event.role, item_id=event.item_id, text=event.text))
        elif isinstance(event, ToolCallRequested):
            self._transcript.function_call(event.call_id, event.name, event.arguments)
            self._tools.request(event.call_id, event.name, event.arguments)
        elif isinstance(event, ToolCallsCancelled):
            self._tools.cancel_wanted(event.call_ids)
        elif isinstance(event, ResponseInterrupted):
            self._barge_in("provider_interrupted")
            turns.provider_stopped()
            self._tasks.pulse()
        elif isinstance(event, ResumeHandleUpdated):
            self._resume_handle, self._handle_resumable = event.handle, event.resumable
        elif isinstance(event, ConnectionExpiring):
            self._rotation.expiring(self._clock(), event.time_left_s)
        elif isinstance(event, ProviderNoticed):
            self._counts["notices"] += 1
            log.info("call %s: provider notice %s: %s", self.call_id, event.code, event.message)
            self._record(NoticeReceived(code=event.code, message=event.message))
        elif isinstance(event, ProviderErrored):
            self._errors += 1
            self._record(ErrorOccurred(where="provider", error_type=event.code, message=event.message))
            if event.fatal:
                self._link_lost(link, f"fatal provider error {event.code}", retryable=True, cause="errored")

    # ---------------------------------------------------------------------------- hold and no-input

    @property
    def agent_idle(self) -> bool:
        """Nobody speaks, no reply is running or about to start, and no tool runs in the foreground: what the agent
        said has been played out (a warm transfer's briefing is over when this holds after it spoke)."""
        return self._idle(self._clock())

    @property
    def held(self) -> HoldBy | None:
        """Who holds the call (gateway/session/hold.py), None when it is not on hold."""
        return self._hold.by

    def set_held(self, held: bool, *, by: HoldBy) -> bool:
        """The call goes on hold or comes off it (gateway/session/hold.py); False when nothing changed."""
        if self._state is CallState.ENDING or self._state is CallState.ENDED or (held == self._hold.held):
            return False
        now, queued_ms = self._clock(), self._turns.playout.queued_frames * 20
        if held:
            cancelled = self._turns.response_for_hold()
            self._hold.hold(by, now=now, active_response=cancelled)
            link = self._pipe.usable()
            if cancelled is not None and link is not None:
                self._pipe.enqueue(SendOp(name="cancel_response", send=cancel_response, epoch=link.epoch))
            self._system_note(HOLD_NOTE)
            self._record(CallHeld(by=by, queued_ms=queued_ms, cancelled_response=cancelled or ""))
            log.info(
                "call %s: held by %s, %d ms of agent audio kept, cancelled=%s", self.call_id, by, queued_ms, cancelled
            )
        else:
            held_s = self._hold.resume(by, now=now)
            if held_s is None:
                return False
            self._system_note(RESUME_NOTE)
            self._record(CallResumed(by=by, held_s=held_s, queued_ms=queued_ms))
            log.info(
                "call %s: resumed by %s after %.1f s, %d ms of agent audio to play", self.call_id, by, held_s, queued_ms
            )
        self._tasks.pulse()
        return True

    def _system_note(self, text: str) -> None:
        """A system item for the agent (kept in the transcript, so a resume replays it); no response is asked."""
        self._transcript.message("system", text)
        link = self._pipe.usable()
        if link is not None:
            self._pipe.enqueue(SendOp(name="note", send=partial(send_text, text=text, role="system"), epoch=link.epoch))

    @staticmethod
    def _no_input_timer(profile: AgentProfile) -> NoInputTimer | None:
        policy = NoInputPolicy(prompt_s=profile.no_input_prompt_s, hangup_s=profile.no_input_hangup_s)
        return NoInputTimer(policy) if policy.enabled else None

    def _check_no_input(self, now: float) -> None:
        timer = self._no_input
        assert timer is not None
        waiting = self._turns.idle(now) and not self._tools.running and self._close_task is None
        since = timer.waiting_since
        action = timer.tick(now, waiting=waiting)
        if action == "prompt":
            silent_s = now - since if since is not None else 0.0
            log.info("call %s: no input for %.1f s: prompting", self.call_id, silent_s)
            self._record(NoInputPrompted(silent_s=silent_s))
            self._request_response(f"Say exactly this, then stop: {self._profile.no_input_prompt}")
        elif action == "goodbye":
            log.info("call %s: no input after the prompt: ending the call", self.call_id)
            self._tasks.spawn(self._say_then_end("no_input", self._profile.no_input_goodbye), name="end:no-input")

    # ------------------------------------------------------------------- answering-machine detection

    @property
    def amd(self) -> AmdReport | None:
        """Answering-machine detection's decision (None: off, or not decided yet)."""
        return self._amd.report if self._amd is not None else None

    def _amd_listen(self, source: GreetingTranscribing) -> None:
        self._amd_listener = AmdListener(
            source,
            self._provider_profile,
            on_text=self._amd_heard,
            call_id=self.call_id,
        )
        self._amd_listening = self._tasks.spawn(self._amd_listener.run(), name="amd:words")

    def _amd_heard(self, text: str) -> None:
        amd = self._amd
        if amd is not None and amd.open and self._state is CallState.ACTIVE:
            self._amd_act(amd, amd.words(text))

    def _amd_feed(self, amd: AmdGate, frame: Frame) -> None:
        if self._amd_listener is not None:
            self._amd_listener.feed(frame.pcm)
        self._amd_act(amd, amd.feed(frame.pcm))

    def _amd_act(self, amd: AmdGate, action: AmdAction | None) -> None:
        if (not amd.open or amd.decided is not None) and self._amd_listening is not None:
            self._amd_listening.cancel()  # decided: the greeting's recogniser closes
            self._amd_listening, self._amd_listener = None, None
        decided = amd.decided
        if decided is not None and not self._amd_told:
            self._amd_told = True
            self._record(AmdDetected(result=decided.result.value, reason=decided.reason, at_s=decided.at_s))
            log.info(
                "call %s: AMD %s (%s) at %.2f s; words heard: %r",
                self.call_id,
                decided.result.value,
                decided.reason,
                decided.at_s,
                amd.heard,
            )
            self._tell_amd(amd)
        if action == "greet":
            if self._profile.greeting:
                self._request_response(self._config.greeting_template.format(greeting=self._profile.greeting))
        elif action == "hang_up":
            self._end_call(amd.end_reason)
        elif action == "leave_message":
            report = amd.report
            beep_at_s = report.beep_at_s if report is not None and report.beep_at_s is not None else 0.0
            self._record(VoicemailBeepHeard(at_s=beep_at_s))  # the snapshot's amd.beep_at_s shows it
            leave = self._say_then_end(VOICEMAIL_LEFT, amd.policy.voicemail_message, timeout_s=_VOICEMAIL_TIMEOUT_S)
            self._tasks.spawn(leave, name="end:voicemail")

    def _tell_amd(self, amd: AmdGate) -> None:
        if self._on_amd is not None and amd.report is not None:
            try:
                self._on_amd(amd.report)
            except Exception as exc:
                self._error("amd report", exc)

    # -------------------------------------------------------------------------------------- barge-in

    def _caller_started(self, trigger: Literal["speech_started", "local_vad"], *, item_id: str) -> None:
        self._turns.caller_started()
        if self._no_input is not None:
            self._no_input.caller_spoke()
        self._followed_up = False
        if item_id:
            self._transcript.placeholder("user", item_id)
        self._barge_in(trigger)

    def _barge_in(self, trigger: Literal["speech_started", "provider_interrupted", "local_vad", "api"]) -> None:
        """Stop agent audio within this tick; cancel, and truncate at what the caller actually heard. Idempotent."""
        link = self._pipe.usable()
        if self._state is not CallState.ACTIVE or link is None:
            return
        cut = self._cut(link, cancel=trigger != "provider_interrupted")
        if cut is None:
            return
        self._counts["barge_ins"] += 1
        items = cut.items
        described = " ".join(f"{i.item_id}:sent_ms={i.sent_ms}:received_ms={i.received_ms}" for i in items) or "-"
        log.info(
            "call %s: barge-in (%s) response=%s cancelled=%s items=%s",
            *(self.call_id, trigger, cut.response_id, cut.cancelled, described),
        )
        self._record(
            BargedIn(
                trigger=trigger,
                response_id=cut.response_id,
                items=items,
                cancelled=cut.cancelled,
                truncated=cut.truncated,
            )
        )
        self._tasks.pulse()

    def _cut(self, link: Link, *, cancel: bool) -> Cut | None:
        """Drop queued agent audio (the next tick sends none), cancel the response when ``cancel``, and truncate
        each item at what the caller was actually sent. None when nothing was playing or running."""
        interruption = self._turns.interrupt()
        if self._turns.playout.markers_due:
            self._report_markers()
        if interruption is None:
            return None
        response, items = interruption.response_id, interruption.items
        self._transcript.truncated(tuple(item.item_id for item in items))
        cancel = cancel and response is not None
        if cancel:
            self._pipe.enqueue(SendOp(name="cancel_response", send=cancel_response, epoch=link.epoch))
        truncate = self._caps.truncate and bool(items)
        for item in items if truncate else ():
            if item.sent_ms > 0:
                send = partial(
                    truncate_item,
                    item_id=item.item_id,
                    content_index=item.content_index,
                    audio_end_ms=item.audio_end_ms,
                )
            else:
                send = partial(delete_item, item_id=item.item_id)
            self._pipe.enqueue(SendOp(name="truncate", send=send, epoch=link.epoch))
        response_id = response or (items[0].response_id if items else "")
        return Cut(response_id=response_id, items=items, cancelled=cancel, truncated=truncate)

    def _guardrail_tripped(self, trip: Trip) -> None:
        """Cut the agent at once (like a barge-in) and send one follow-up naming the guardrail; the event is
        recorded at the next tick, the first to send none of the cut audio."""
        link = self._pipe.usable()
        if self._state is not CallState.ACTIVE or link is None or self._close_task is not None:
            return
        turns = self._turns
        playing = (bool(trip.response_id) and turns.active_response == trip.response_id) or turns.playout.has_item(
            trip.item_id
        )
        cut = self._cut(link, cancel=True) if playing else None
        # One follow-up until the caller speaks again: a follow-up that trips too is cut without another (no loop).
        follow_up = not self._followed_up
        if follow_up:
            self._followed_up = True
            text = self._config.guardrail_follow_up.format(guardrail=trip.guardrail, reason=trip.reason)
            self._transcript.message("system", text)
            send = partial(send_text, text=text, role="system")
            self._pipe.enqueue(SendOp(name="guardrail_follow_up", send=send, epoch=link.epoch))
            self._request_response()
        self._trips_pending.append((trip, cut, follow_up))
        self._tasks.pulse()

    def _record_trips(self, now: float | None, index: int | None) -> None:
        pending, self._trips_pending = self._trips_pending, []
        for trip, cut, follow_up in pending:
            event = tripped_event(trip, cut, followed_up=follow_up, stopped_at=now, stopped_frame=index)
            described = " ".join(f"{i.item_id}:sent_ms={i.sent_ms}:received_ms={i.received_ms}" for i in event.items)
            log.info(
                "call %s: guardrail %s tripped response=%s received_at=%.6f stopped_at=%s stopped_frame=%s items=%s",
                *(self.call_id, trip.guardrail, event.response_id, trip.received_at, now, index, described or "-"),
            )
            self._record(event)
            self._trip_log.append((self._clock(), event))
            if self._on_guardrail_tripped is not None:
                try:
                    self._on_guardrail_tripped(event)
                except Exception as exc:
                    self._error("guardrail observer", exc)

    def _report_markers(self) -> None:
        """Call back the provider's markers whose audio was sent (cleared False) or dropped by a barge-in."""
        due, cleared = self._turns.playout.take_markers()
        for marker in due:
            self._marker_reached(marker, cleared=False)
        for marker in cleared:
            self._marker_reached(marker, cleared=True)

    def _marker_reached(self, marker: AudioMarked, *, cleared: bool) -> None:
        try:
            marker.reached(marker.marker, cleared)
        except Exception as exc:
            self._error("provider marker callback", exc)

    # ---------------------------------------------------------------------------- resume / rotation

    def _on_send_failed(self, link: Link, exc: BaseException) -> None:
        self._error("provider send", exc)
        retryable = exc.retryable if isinstance(exc, ProviderError) else True
        self._link_lost(link, f"send failed: {_describe(exc)}", retryable=retryable, cause="dropped")

    def _link_lost(self, link: Link, reason: str, *, retryable: bool, cause: ResumeCause) -> None:
        if link.stale or link is not self._pipe.link or self._tasks.closing:
            return
        if self._state is not CallState.ACTIVE:
            # Connecting (start() notices the stale link) or already switching: stop using this connection.
            self._connections.retire(self._pipe.retire())
            return
        if not retryable:
            self._connections.retire(self._pipe.retire())
            self._tasks.spawn(self._end_unavailable(reason), name="end:provider-unavailable")
            return
        self._begin_switch(cause, reason, old_alive=False)

    def _maybe_rotate(self, now: float) -> None:
        if self._state is not CallState.ACTIVE or self._switch_task is not None or self._updating:
            return
        cause = self._rotation.due(now, between_turns=self._turns.between_turns)
        if cause is not None:
            self._begin_switch(cause, "connection rotation", old_alive=True)

    def _begin_switch(self, cause: ResumeCause, reason: str, *, old_alive: bool) -> None:
        self._transition(CallState.RESUMING, f"{cause}: {reason}")
        if not old_alive:
            self._connections.retire(self._pipe.retire())
        self._turns.silence_agent()
        self._rotation.cancel()
        held_before = self._pipe.frames_held
        self._switch_task = self._tasks.spawn(self._switch(cause, reason, held_before), name=f"resume:{cause}")

    async def _switch(self, cause: ResumeCause, reason: str, held_before: int) -> None:
        """RESUMING: connect anew with the transcript (and resume handle), flush held frames; or end politely."""
        config = self._config
        self._record(ResumeStarted(cause=cause, reason=reason))
        error = "no attempt made"
        try:
            for attempt in range(1, config.resume_attempts + 1):
                if attempt > 1:
                    await asyncio.sleep(config.backoff_s(attempt - 1))
                handle = self._resume_handle if self._caps.resume_handle and self._handle_resumable else None
                history = self._handoffs.replay(
                    self._transcript.history(resume_instruction=self._resume_instruction(self._profile))
                )
                try:
                    with self._traced_connect(attempt, resuming=True):
                        session = await self._connections.connect(
                            self._provider_profile, history=history, resume_handle=handle
                        )
                except Exception as exc:
                    error = _describe(exc)
                    self._record(ResumeAttemptFailed(attempt=attempt, error=error))
                    if isinstance(exc, ProviderError) and not exc.retryable:
                        break
                    continue
                link = self._install(session)
                self._counts["rotations" if cause in ("rotation", "expiring") else "resumes"] += 1
                self._transition(CallState.ACTIVE, f"resumed after {cause}")
                held = self._pipe.frames_held - held_before
                log.info(
                    "call %s: resumed after %s (attempt %d), %d caller frames held", self.call_id, cause, attempt, held
                )
                self._record(
                    Resumed(cause=cause, attempts=attempt, epoch=link.epoch, held_frames=held, used_handle=bool(handle))
                )
                self._pipe.wake()
                return
            self._counts["resume_failures"] += 1
            still_alive = self._pipe.usable() is not None
            self._record(ResumeFailed(attempts=config.resume_attempts, error=error, fatal=not still_alive))
            if still_alive:
                # A rotation that could not connect: the current connection still carries the call.
                self._transition(CallState.ACTIVE, "rotation failed; staying on the current connection")
                self._pipe.wake()
                return
        finally:
            self._switch_task = None
        await self._end_unavailable(error)

    def _install(self, session: RealtimeSession) -> Link:
        # A G.711 profile talks G.711 to the provider: caller frames are converted at this edge; the provider's
        # codes are played as codes (pull_outbound), so a G.711 caller gets them without any resampling.
        audio_format = self._provider_profile.audio_format
        if audio_format == "pcm24k":
            self._g711 = None
        elif self._g711 is None or self._g711.law != audio_format:
            self._g711 = G711Transcoder(audio_format)
        self._pipe.encode = None if self._g711 is None else self._g711.encode
        link, old = self._connections.install(session)
        self._connections.retire(old)
        self._turns.new_connection()
        self._rotation.connection_opened(link.opened_at)
        return link

    async def _connect_at_start(self) -> RealtimeSession:
        error: BaseException | None = None
        for attempt in range(1, self._config.connect_attempts + 1):
            if attempt > 1:
                await asyncio.sleep(self._config.backoff_s(attempt - 1))
            try:
                with self._traced_connect(attempt, resuming=False):
                    return await self._connections.connect_owned(
                        self._provider_profile, history=self._transcript.history()
                    )
            except ProviderError as exc:
                error = exc
                if not exc.retryable:
                    break
            except TimeoutError as exc:
                error = exc
        message = f"could not connect to provider {self._model.name!r}: {_describe(error)}"
        raise caused(SessionStartError(message, reason="provider_unavailable"), error)

    # ------------------------------------------------------------------------------------------ ending

    async def _end_unavailable(self, error: str) -> None:
        log.warning("call %s: provider unavailable (%s); ending the call", self.call_id, error)
        audio = self._config.apology_audio
        if audio:
            self._turns.play_prompt(audio)
            await self._tasks.wait_until(lambda: not self._turns.playout.playing, len(audio) / 48_000 + 2.0)
        await asyncio.shield(self._begin_close("provider_unavailable", hang_up=True))

    async def _end_at_max_duration(self) -> None:
        await self._say_then_end("max_duration", self._config.goodbye_message)

    async def end_with_goodbye(self, reason: str, message: str) -> None:
        """End the call from our side, politely: the agent says ``message`` first (bounded by
        ``goodbye_timeout_s``; skipped when the provider is not connected or ``message`` is empty), then the
        caller is hung up with ``reason``. Returns once the call has ENDED."""
        if self._close_task is None and self._state in (CallState.ACTIVE, CallState.RESUMING):
            await self._say_then_end(reason, message)
        await self._ended.wait()

    async def _say_then_end(self, reason: str, message: str, *, timeout_s: float | None = None) -> None:
        if message and self._caps.speaks and self._pipe.usable() is not None:
            started = self._turns.responses_started
            self._request_response(f"Say exactly this, then stop: {message}")
            await self._tasks.wait_until(
                lambda: (
                    (self._turns.responses_started > started and self._turns.agent_quiet)
                    or self._close_task is not None
                ),  # the caller hung up meanwhile
                self._config.goodbye_timeout_s if timeout_s is None else timeout_s,
            )
        await asyncio.shield(self._begin_close(reason, hang_up=True))

    def _end_call(self, reason: str) -> None:
        """The session itself ends the call: hang up toward the caller, then tear down."""
        self._begin_close(reason, hang_up=True)

    def _begin_close(self, reason: str, *, hang_up: bool) -> asyncio.Task[None]:
        if self._close_task is None:
            self._tasks.closing = True
            self._end_reason = reason
            self._hang_up_reason = reason if hang_up else None
            self._close_task = asyncio.get_running_loop().create_task(
                self._teardown(), name=f"call-{self.call_id}:close"
            )
        return self._close_task

    async def _teardown(self) -> None:
        reason = self._end_reason or "closed"
        try:
            if self._state is not CallState.ENDING:
                self._transition(CallState.ENDING, reason)
            leaked = await self._tasks.cancel_all(timeout_s=self._config.close_timeout_s)
            await self._guardrails.aclose()
            if leaked:
                self._record(ErrorOccurred(where="teardown", error_type="TaskLeak", message=", ".join(leaked)))
            if self._hang_up_reason is not None:
                try:
                    async with asyncio.timeout(self._config.close_timeout_s):
                        await self._control.hang_up(self._hang_up_reason)
                except Exception as exc:
                    self._error("hang_up", exc)
            await self._connections.close_all()
            self._pipe.drain_ops()
            self._tools.finish()
            try:
                if self._owns_registry:
                    await self._registry.aclose()
                await self._handoffs.aclose()
            except Exception as exc:
                self._error("closing the tool registry", exc)
        finally:
            self._transition(CallState.ENDED, reason)
            if self._trips_pending:
                self._record_trips(None, None)
            self._record(SessionEnded(reason=reason))
            self._events.close()
            self._tasks.release()
            self._pipe.release()
            self._connections.release()
            self._host.release()
            self._handoffs.release()
            self._guardrails.release()
            self._on_guardrail_tripped = None
            self._on_amd = None  # the worker's callback holds its leg, which holds this session
            self._ended.set()
            log.info("call %s ended: %s; %s", self.call_id, reason, self.stats().counters())

    # --------------------------------------------------------------------------------------- plumbing

    def _transition(self, new: CallState, reason: str) -> None:
        old = self._state
        check_transition(old, new)
        self._state = new
        self._record(StateChanged(old=old, new=new, reason=reason))
        self._tasks.pulse()

    def _record(self, event: SessionEvent) -> None:
        self._events.append(event)
        if self._trace is not None:
            self._trace.on_event(event)

    def _traced_connect(self, attempt: int, *, resuming: bool) -> contextlib.AbstractContextManager[None]:
        return self._trace.connect(attempt, resuming=resuming) if self._trace is not None else contextlib.nullcontext()

    @property
    def trace(self) -> SessionTrace | None:
        return self._trace

    def _error(self, where: str, exc: BaseException) -> None:
        self._errors += 1
        log.warning("call %s: %s failed: %s", self.call_id, where, _describe(exc), exc_info=exc)
        self._record(ErrorOccurred(where=where, error_type=type(exc).__name__, message=str(exc)))

    def _for_provider(self, profile: AgentProfile) -> AgentProfile:
        """The profile as the adapter gets it: resolved tools; no resume note (the replayed history has it)."""
        return replace(profile, tools=self._handoffs.tools_for(profile, self._registry), resume_note="")

    def _resume_instruction(self, profile: AgentProfile) -> str:
        return self._config.resume_instruction or profile.resume_note

    def _elapsed(self) -> float:
        return round(self._clock() - self._started_at, 3)

    def _idle(self, now: float) -> bool:
        return self._turns.idle(now) and not self._tools.foreground_running

    def _request_response(self, instructions: str | None = None) -> None:
        """Ask for a response once the current one (if any) is done; repeated requests coalesce."""
        if self._turns.want_response(instructions):
            self._pipe.enqueue(
                SendOp(
                    name="create_response",
                    send=partial(create_response, instructions=instructions),
                    on_dropped=lambda _reason: self._turns.response_request_dropped(),
                )
            )


def _traced_latency(observer: LatencyObserver | None, trace: SessionTrace) -> LatencyObserver:
    """The latency observer, with each turn's round trip also made the turn's span."""

    def observe(kind: Literal["round_trip", "agent_audio_wait"], seconds: float) -> None:
        if observer is not None:
            observer(kind, seconds)
        if kind == "round_trip":
            trace.turn(seconds)

    return observe


def _start_failure_reason(exc: BaseException) -> str:
    if isinstance(exc, SessionStartError):
        return exc.reason
    if isinstance(exc, asyncio.CancelledError):
        return "start_cancelled"
    if isinstance(exc, ProviderError):
        return "provider_unavailable"
    return "start_failed"
