"""Browser (WebRTC) calls in the media worker: admission, one CallSession per call, reporting, clean-up.

A browser call joins the same session core as a SIP call. The aiortc glue
(:class:`gateway.transport.webrtc.WebRtcPeer`) turns Opus into 24 kHz frames for ``session.push_inbound`` and
paces ``session.pull_outbound`` at 20 ms for the agent's voice; barge-in, resume and tools live in the session
and behave exactly as for SIP. Keypad digits and hang-up arrive as JSON on the page's ``control`` data channel.

Life of a call: ``answer()`` (from ``POST /v1/webrtc/offer``) checks the local limits, asks the control plane
to admit it (``kind="webrtc"``), answers the offer, and starts the call's task, which runs the session until
the peer closes (page hang-up, DTLS close, ICE failure, no caller audio), the session ends (agent hang-up,
max duration, provider unavailable) or the ops API hangs up. Every path goes through :meth:`WebRtcCalls.end`
(the state table of gateway/worker/legs.py; the page is told once) and :meth:`WebRtcCalls._finish`, which closes
the session and the peer connection and reports ``call.ended``.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
import weakref
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gateway.fleet.errors import CommandRejectedError
from gateway.fleet.models import (
    DTMF_DIGITS,
    AdmissionRequest,
    CallSnapshot,
    ProfileModel,
    WorkerEvent,
)
from gateway.observability import ACTIVE_CALLS, CALL_SETUP_SECONDS, CALLS_TOTAL
from gateway.session.control import TransferOutcome, WarmTransferStart
from gateway.session.session import CallSession
from gateway.sip.caller_context import CallContext, context_of_page, render
from gateway.tasks import TaskSet
from gateway.tracing import CallTrace, traceparent_of
from gateway.transport.webrtc import (
    CallRefusedError,
    OfferError,
    PeerStats,
    WebRtcAnswer,
    WebRtcConfig,
    WebRtcPeer,
    check_offer,
    parse_ice_servers,
)
from gateway.worker.counters import CallFigures, latency_observer, session_figures
from gateway.worker.handoffs import HandoffEvent, ProfileHandoffs, handoff_report
from gateway.worker.legs import SNAPSHOT_STATE, LegKind, LegRegistry, LegState, begin_end, move
from gateway.worker.ports import CallHost
from gateway.worker.reporting import build_snapshot, level_fields, media_fields
from gateway.worker.settings import CapacitySettings
from telcodecs.frames import Frame, dbfs

log = logging.getLogger(__name__)

_DEFAULT_PROFILE = ProfileModel(name="echo", provider="echo")
_LEVEL_EVERY_FRAMES = 25  # one caller level sample per 0.5 s for the dashboard sparkline
_ANY_ADDRESS = ("0.0.0.0", "::", "")
_CARRYING = (LegState.RINGING, LegState.ACTIVE)  # the states in which a browser call's audio flows


class WebRtcSettings(BaseSettings):
    """``GATEWAY_WEBRTC_*``: limits, ICE servers and addresses of the worker's browser calls."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_WEBRTC_", frozen=True, extra="ignore")

    max_calls: int = Field(
        default=20, ge=0, description="Concurrent browser calls on this worker, whatever capacity is left."
    )
    ice_servers: str = Field(
        default="",
        description="STUN/TURN servers: a JSON list of `{urls, username, credential}`, or comma-separated URLs; "
        "empty: host candidates only.",
    )
    advertised_host: str | None = Field(
        default=None, description="Address written into the host candidates (the public address behind NAT)."
    )
    host_addresses: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="Local addresses of the ICE host candidates, comma-separated; empty: the worker's media "
        "address (every interface when that is 0.0.0.0 or ::).",
    )
    connect_timeout_s: float = Field(
        default=15.0, gt=0, description="A browser call whose ICE and DTLS are not connected by then is ended."
    )
    media_timeout_s: float = Field(
        default=10.0, gt=0, description="A connected browser call with no caller audio for this long is ended."
    )
    encoder: Literal["gateway", "aiortc"] = Field(
        default="gateway",
        description="Who encodes the agent's Opus: the gateway (mono, 32 kbit/s, in the track) or aiortc's sender "
        "(stereo, 96 kbit/s, in a thread-pool job per packet: more CPU, kept to measure against).",
    )
    decoder: Literal["gateway", "aiortc"] = Field(
        default="gateway",
        description="Who puts the caller's packets in order and decodes their Opus: the gateway (on the event loop, "
        "as aiortc's receiver hands each packet over) or aiortc's jitter buffer and decoder thread per call (80 ms "
        "of prefetch, more CPU; kept to measure against).",
    )

    @field_validator("host_addresses", mode="before")
    @classmethod
    def _split_csv(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("ice_servers")
    @classmethod
    def _ice_servers(cls, value: str) -> str:
        parse_ice_servers(value)
        return value

    def peer_config(self, media_host: str) -> WebRtcConfig:
        if self.host_addresses:
            addresses: tuple[str, ...] | None = self.host_addresses
        elif media_host in _ANY_ADDRESS:
            addresses = None
        else:
            addresses = (media_host,)
        return WebRtcConfig(
            ice_servers=parse_ice_servers(self.ice_servers),
            host_addresses=addresses,
            advertised_host=self.advertised_host,
            connect_timeout_s=self.connect_timeout_s,
            media_timeout_s=self.media_timeout_s,
            encoder=self.encoder,
            decoder=self.decoder,
        )


@dataclass(eq=False)
class WebRtcLeg:
    """One browser call as the worker sees it: the browser kind of :class:`gateway.worker.legs.Leg`."""

    id: str
    client: str
    owner: WebRtcCalls
    kind: LegKind = "webrtc"
    route: str = ""
    profile: ProfileModel | None = None
    metadata: dict[str, str] = field(default_factory=dict)  # the page's, from its call token
    context: CallContext | None = None
    state: LegState = LegState.ADMITTED
    peer: WebRtcPeer | None = None
    session: CallSession | None = None
    trace: CallTrace | None = None  # the call's spans on this worker (gateway/tracing.py)
    started_wall: float = field(default_factory=time.time)
    started_mono: float = field(default_factory=time.monotonic)
    answered_wall: float | None = None
    ended_wall: float | None = None
    end_reason: str = ""
    task: asyncio.Task[None] | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    last_stats: PeerStats = field(default_factory=PeerStats)
    levels: deque[float] = field(default_factory=lambda: deque(maxlen=120))
    last_level: float | None = None
    frames_in: int = 0
    dtmf_in: int = 0
    page_told: bool = False  # the page got {"type": "ended"}
    finishing: bool = False  # _finish has begun releasing it
    cost: float = 1.0  # of the worker's capacity: CapacitySettings.webrtc_call_cost

    @property
    def live(self) -> bool:
        return self.state is not LegState.ENDED

    async def snapshot(self) -> CallSnapshot:
        return await self.owner.snapshot_of(self)

    def hang_up(self, reason: str) -> None:
        self.owner.end(self, reason)

    def send_dtmf(self, digits: str) -> None:
        self.owner.send_dtmf_leg(self, digits)

    def transfer(self, target: str) -> None:
        raise CommandRejectedError("a browser call cannot be transferred")

    def hold(self, held: bool) -> None:
        raise CommandRejectedError("a browser call cannot be put on hold")

    def receive_fields(self) -> dict[str, int]:
        """What the gateway's own receive path did to the caller's audio (nothing when aiortc decodes it)."""
        sink = self.peer.receive_sink if self.peer is not None else None
        if sink is None:
            return {}
        return {"concealed": sink.concealed, "late": sink.late}

    def figures(self) -> CallFigures | None:
        """The call's running totals for the worker's counters; None before it has a session."""
        if self.session is None:
            return None
        concealed = self.receive_fields().get("concealed", 0)
        return session_figures(self.id, agent_audio_gaps=self.session.agent_audio_gaps, concealed=concealed)


class WebRtcCallControl:
    """The session's CallControl for a browser call: hang up, DTMF to the page; no transfer.

    It holds its leg weakly (the leg owns the session, which owns this control): see SipCallControl.
    """

    def __init__(self, leg: WebRtcLeg) -> None:
        self._leg_ref = weakref.ref(leg)

    async def hang_up(self, reason: str) -> None:
        leg = self._leg_ref()
        if leg is not None:  # a leg that is gone has ended already
            leg.hang_up(reason)

    async def send_dtmf(self, digits: str) -> None:
        leg = self._leg_ref()
        if leg is None:
            raise CommandRejectedError("the call has ended")
        leg.send_dtmf(digits)

    async def transfer(self, target: str) -> TransferOutcome:
        return TransferOutcome(status="refused", detail="a browser call cannot be transferred")

    async def warm_transfer(self, target: str, summary: str, briefing: str | None = None) -> WarmTransferStart:
        return WarmTransferStart(status="refused", detail="a browser call cannot be transferred")

    async def hold(self, held: bool) -> None:
        raise CommandRejectedError("a browser call cannot be put on hold")


class WebRtcCalls:
    """The worker's browser calls, built with the call host port, their own settings, what a browser call costs,
    and the worker's registry of legs (where the commands find them). ``answer()`` takes an offer."""

    def __init__(
        self,
        host: CallHost,
        settings: WebRtcSettings | None = None,
        *,
        legs: LegRegistry | None = None,
        costs: CapacitySettings | None = None,
        media_host: str = "127.0.0.1",
    ) -> None:
        self._host = host
        self.settings = settings or WebRtcSettings()
        self.config = self.settings.peer_config(media_host)
        self.legs = legs if legs is not None else LegRegistry()
        self._costs = costs or CapacitySettings()
        self._cost = self._costs.webrtc_call_cost
        self._tasks = TaskSet("webrtc")
        self._closing = False

    # -------------------------------------------------------------------------------- bookkeeping

    @property
    def live_count(self) -> int:
        return self.legs.live_count("webrtc")

    def _own_legs(self) -> list[WebRtcLeg]:
        return [leg for leg in self.legs.values() if isinstance(leg, WebRtcLeg)]

    def figures(self) -> list[CallFigures]:
        """The running totals of the browser calls that have a session, for the worker's counters."""
        return [figures for leg in self._own_legs() if (figures := leg.figures()) is not None]

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        return self._tasks.spawn(coro, name)

    # -------------------------------------------------------------------------------------- answer

    async def answer(
        self, sdp: str, *, route: str | None, public: bool, client: str = "", metadata: Mapping[str, str] | None = None
    ) -> WebRtcAnswer:
        """Admit a browser call and answer its offer. Raises OfferError (400) or CallRefusedError. ``metadata``:
        what the page's call token carried, the call's context."""
        worker = self._host
        if self._closing or worker.draining:
            raise CallRefusedError(503, "draining", "the gateway is not taking new calls", retry_after_s=5)
        if self.live_count >= self.settings.max_calls:
            raise CallRefusedError(
                503,
                "webrtc_busy",
                f"the limit of {self.settings.max_calls} concurrent browser calls is reached",
                retry_after_s=5,
            )
        check_offer(sdp)
        leg = WebRtcLeg(
            id=f"w-{secrets.token_hex(6)}", client=client, owner=self, cost=self._cost, metadata=dict(metadata or {})
        )
        self.legs.add(leg)  # counts against the limit from now on
        leg.trace = CallTrace(
            leg.id, "call", attributes={"gateway.call.direction": "inbound", "gateway.call.kind": "webrtc"}
        )
        leg.trace.start("setup", "call.setup")
        try:
            await self._admit(leg, route=route, public=public)
            leg.peer = WebRtcPeer(
                self.config,
                on_frame=partial(self._caller_frame, leg),
                pull_frame=partial(self._agent_frame, leg),
                on_message=partial(self._page_message, leg),
                name=f"call-{leg.id}",
            )
            answer = await leg.peer.answer(sdp)
        except BaseException as exc:
            if isinstance(exc, OfferError):
                reason = "bad_sdp"
            elif isinstance(exc, CallRefusedError):
                reason = exc.code
            else:
                reason = "internal_error"
            # Admitted calls hold a slot on the control plane until call.ended releases it.
            admitted = bool(leg.route)
            await self._finish(leg, reason if admitted else f"rejected_{reason}", report=admitted)
            raise
        if leg.state is LegState.ADMITTED:  # (a hang-up meanwhile left it ending: its task finishes it at once)
            move(leg, LegState.RINGING)
        leg.trace.end("setup", {"gateway.route": leg.route})
        with leg.trace.active():  # the call's task (and its session's) log under its trace
            leg.task = self._spawn(self._run(leg), name=f"call-{leg.id}")
        await self._report("call.started", leg)
        log.info("browser call %s from %s: answered (route %s)", leg.id, client or "?", leg.route)
        return WebRtcAnswer(sdp=answer, call_id=leg.id)

    async def _admit(self, leg: WebRtcLeg, *, route: str | None, public: bool) -> None:
        worker = self._host
        if worker.over_capacity():
            raise CallRefusedError(503, "over_capacity", "the worker is full", retry_after_s=5)
        if worker.link is None:  # a worker without a control plane (tests, embedding): the default echo route
            leg.route, leg.profile = route or "default", _DEFAULT_PROFILE
            return
        request = AdmissionRequest(
            caller=leg.client[:256],
            source=leg.client[:256],
            kind="webrtc",
            direction="inbound",
            route=route,
            worker=worker.id,
            call_id=leg.id,
            public=public,
            cost=leg.cost,
            metadata=dict(leg.metadata),
            traceparent=traceparent_of(leg.trace.start("admit", "call.admit", parent="setup")) if leg.trace else "",
        )
        try:
            decision = await worker.link.admit(request)
        except Exception as exc:
            log.warning("admission for %s failed: %s", leg.id, exc)
            raise CallRefusedError(503, "no_control", "control plane unreachable", retry_after_s=5) from None
        finally:
            if leg.trace is not None:
                leg.trace.end("admit")
        if not decision.accepted:
            raise CallRefusedError(
                decision.status,
                decision.code or "rejected",
                decision.reason or "not admitted",
                retry_after_s=decision.retry_after_s,
            )
        leg.route = decision.route
        leg.profile = decision.profile or _DEFAULT_PROFILE
        if decision.metadata:  # the call-time application's, added to the page's
            leg.metadata = {**leg.metadata, **decision.metadata}

    # --------------------------------------------------------------------------------- media edges

    def _caller_frame(self, leg: WebRtcLeg, frame: Frame) -> None:
        leg.frames_in += 1
        if leg.frames_in % _LEVEL_EVERY_FRAMES == 0:
            leg.last_level = max(dbfs(frame.pcm), -100.0)
            leg.levels.append(leg.last_level)
        session = leg.session
        if session is not None and leg.state in _CARRYING:
            session.push_inbound(frame)

    def _agent_frame(self, leg: WebRtcLeg) -> Frame | None:
        session = leg.session
        if session is None or leg.state not in _CARRYING:
            return None
        return session.pull_outbound()

    def _page_message(self, leg: WebRtcLeg, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "dtmf":
            digit = message.get("digit")
            if not isinstance(digit, str) or len(digit) != 1 or not DTMF_DIGITS.fullmatch(digit):
                log.debug("call %s: ignored DTMF %r from the page", leg.id, digit)
                return
            duration = message.get("duration_ms")
            duration_ms = int(duration) if isinstance(duration, int) and 0 < duration <= 2000 else 160
            leg.dtmf_in += 1
            if leg.session is not None:
                leg.session.dtmf_received(digit.upper(), duration_ms=duration_ms)
        elif kind == "hangup":
            self.end(leg, "caller_hangup")

    # ------------------------------------------------------------------------------------ the call

    def _new_session(self, leg: WebRtcLeg) -> CallSession:
        worker = self._host
        profile_model = leg.profile or _DEFAULT_PROFILE
        context = leg.context = context_of_page(
            metadata=leg.metadata,
            policy=profile_model.context.to_policy(),
            call_id=leg.id,
            route=leg.route,
            source=leg.client,
        )
        agent = profile_model.to_agent_profile()
        profile = replace(
            agent,
            instructions=render(agent.instructions, context),
            greeting=render(agent.greeting, context),
            call_context=context.as_parameters(),
        )
        model = worker.model_for(profile.provider)
        leg.cost = self._cost + self._costs.agent_cost(model, profile)
        config = worker.session_config
        if profile_model.guardrails:
            config = replace(
                config,
                guardrails=profile_model.guardrail_configs(),
                guardrail_every_chars=profile_model.guardrail_every_chars,
            )
        return CallSession(
            call_id=leg.id,
            profile=profile,
            model=model,
            control=WebRtcCallControl(leg),
            config=config,
            on_latency=latency_observer(worker.id, model.name),
            handoffs=ProfileHandoffs(profile_model.handoff_profiles, context=context, model_for=worker.model_for),
            on_handoff=partial(self._handoff_reported, leg),
            trace=leg.trace,
            on_guardrail_tripped=lambda _event: self._spawn(
                self._report("guardrail.tripped", leg), name=f"call-{leg.id}-report"
            ),
        )

    async def _run(self, leg: WebRtcLeg) -> None:
        reason = "ended"
        try:
            if leg.stop.is_set():
                return
            leg.session = self._new_session(leg)
            try:
                await leg.session.start()
            except Exception as exc:
                log.warning("call %s: session failed to start: %s", leg.id, exc)
                reason = leg.end_reason or "provider_unavailable"
                return
            reason = await self._until_ended(leg)
        except asyncio.CancelledError:
            reason = leg.end_reason or "shutdown"
            raise
        except Exception:
            log.exception("call %s failed", leg.id)
            reason = "internal_error"
        finally:
            await self._finish(leg, leg.end_reason or reason)

    async def _until_ended(self, leg: WebRtcLeg) -> str:
        assert leg.peer is not None and leg.session is not None
        watch = asyncio.create_task(
            leg.peer.wait_closed(on_connected=partial(self._connected, leg)), name=f"call-{leg.id}-ice"
        )
        ended = asyncio.create_task(leg.session.wait_ended(), name=f"call-{leg.id}-session")
        stop = asyncio.create_task(leg.stop.wait(), name=f"call-{leg.id}-stop")
        waiting = (watch, ended, stop)
        try:
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
        if leg.end_reason:
            return leg.end_reason
        if watch.done() and not watch.cancelled():
            return {"peer_closed": "caller_hangup"}.get(watch.result(), watch.result())
        if ended.done() and not ended.cancelled():
            return ended.result() or "agent_ended"
        return "ended"

    def _connected(self, leg: WebRtcLeg) -> None:
        if leg.state is not LegState.RINGING:
            return
        move(leg, LegState.ACTIVE)
        leg.answered_wall = time.time()
        worker_label = self._host.id
        CALL_SETUP_SECONDS.labels(worker_label).observe(time.monotonic() - leg.started_mono)
        ACTIVE_CALLS.labels(worker_label).inc()
        log.info("browser call %s connected", leg.id)
        self._spawn(self._report("call.updated", leg), name=f"call-{leg.id}-report")

    # -------------------------------------------------------------------------------------- ending

    def end(self, leg: WebRtcLeg, reason: str) -> None:
        """The one way a browser call ends, whoever ends it. The first reason is the one recorded, the state moves
        to ENDING once, the page is told once; then the call's task is woken to finish it (:meth:`_finish`)."""
        if not begin_end(leg, reason):
            return
        self._tell_page_ended(leg)
        leg.stop.set()
        if leg.session is not None and leg.task is not None and not leg.task.done():
            self._spawn(leg.session.aclose(leg.end_reason), name=f"call-{leg.id}-close")

    def _tell_page_ended(self, leg: WebRtcLeg) -> None:
        if leg.peer is not None and not leg.page_told:
            leg.page_told = leg.peer.send_message({"type": "ended", "reason": leg.end_reason})

    async def _finish(self, leg: WebRtcLeg, reason: str, *, report: bool = True) -> None:
        """Release what the call held, once: the session, the peer connection, the record."""
        if leg.state is LegState.ENDED or leg.finishing:
            return
        leg.finishing = True
        self.end(leg, reason)
        was_active = leg.answered_wall is not None
        if leg.session is not None:
            try:
                await leg.session.aclose(leg.end_reason)
            except Exception:
                log.exception("call %s: session close failed", leg.id)
        if leg.peer is not None:
            leg.last_stats = await leg.peer.stats()
            self._tell_page_ended(leg)
            await leg.peer.aclose()
        move(leg, LegState.ENDED)
        leg.ended_wall = time.time()
        worker_label = self._host.id
        if was_active:
            ACTIVE_CALLS.labels(worker_label).dec()
        CALLS_TOTAL.labels(worker_label, leg.end_reason).inc()
        if leg.trace is not None:
            leg.trace.close(end_reason=leg.end_reason)
        log.info("browser call %s ended: %s", leg.id, leg.end_reason)
        self._host.counters.call_ended(leg.id, leg.figures())
        if report:
            await self._report("call.ended", leg)
        self.legs.remove(leg)
        self._host.call_ended()

    async def aclose(self, reason: str = "shutdown") -> None:
        """End every browser call and wait (bounded) for them; then cancel what is left."""
        self._closing = True
        for leg in self._own_legs():
            self.end(leg, reason)
        pending = [leg.task for leg in self._own_legs() if leg.task is not None]
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        await self._tasks.aclose()

    # ------------------------------------------------------------------------------------ commands

    def send_dtmf_leg(self, leg: WebRtcLeg, digits: str) -> None:
        if leg.peer is None or not leg.peer.send_message({"type": "dtmf", "digits": digits}):
            raise CommandRejectedError("the browser's control channel is not open")
        if leg.session is not None:
            leg.session.dtmf_sent(digits, method="webrtc")

    # ----------------------------------------------------------------------------------- reporting

    async def snapshot_of(self, leg: WebRtcLeg) -> CallSnapshot:
        if leg.peer is not None and leg.state in _CARRYING:
            leg.last_stats = await leg.peer.stats()
        media = leg.last_stats
        received = leg.receive_fields()
        stats = media_fields(
            packets_in=media.packets_in,
            packets_out=media.packets_out,
            lost=media.packets_lost,
            loss_pct=media.loss_pct,
            jitter_ms=media.jitter_ms,
            rtt_ms=media.rtt_ms,
            # Packetization and Opus' look-ahead, + 4 packets of prefetch when aiortc's jitter buffer is in the way
            delay_ms=40.0 if received else 80.0 + 40.0,
            codec="opus",
            **received,
        )
        stats.update(level_fields(leg.last_level, leg.levels))
        return build_snapshot(
            call_id=leg.id,
            kind="webrtc",
            direction="inbound",
            from_=leg.client,
            to=leg.route,
            route=leg.route,
            provider=leg.profile.provider if leg.profile is not None else "",
            state=SNAPSHOT_STATE[leg.state],
            worker=self._host.id,
            codec="opus",
            cost=leg.cost,
            started=leg.started_wall,
            answered=leg.answered_wall,
            ended=leg.ended_wall,
            end_reason=leg.end_reason,
            stats=stats,
            session=leg.session,
            context=leg.context,
            trace_id=leg.trace.trace_id if leg.trace is not None else "",
        )

    async def snapshot(self) -> list[CallSnapshot]:
        return [await self.snapshot_of(leg) for leg in self._own_legs()]

    def _handoff_reported(self, leg: WebRtcLeg, event: HandoffEvent) -> None:
        kind, data = handoff_report(event)
        self._spawn(self._report(kind, leg, data=data), name=f"call-{leg.id}-{kind}")

    async def _report(self, kind: str, leg: WebRtcLeg, *, data: dict[str, Any] | None = None) -> None:
        link = self._host.link
        if link is None:
            return
        try:
            call = await self.snapshot_of(leg)
            event = WorkerEvent(type=kind, worker=self._host.id, time=time.time(), call=call, data=data or {})  # type: ignore[arg-type]
            await link.report([event])
        except Exception as exc:
            log.warning("report %s for %s failed: %s", kind, leg.id, exc)
