"""The media worker: the composition root of one worker's parts, and the driver of its 20 ms tick.

:func:`gateway.worker.assemble.assemble_worker` builds the parts (SIP calls, browser calls, drain, trunk
registration, the SIP transport and the media plant), each with only the ports it uses; :class:`MediaWorker`
is their :class:`~gateway.worker.ports.CallHost`, runs the tick, heartbeats the control plane, exports the
counters, and answers the control plane's commands through the one registry of legs
(``legs.find(call_id).hang_up(reason)``, whatever the call's kind).

The tick (``_on_tick``) runs at absolute deadlines from :class:`~gateway.transport.clock.MediaClock`:
one outbound frame from each session, batched DSP in the tick engine and RTP out first, so every call's
packets leave at the same point of each tick; then the inbound frames to the sessions, whose caller audio is
written to the providers from the tick when the connections take it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from time import perf_counter
from typing import Any

from gateway import __version__
from gateway.compiled import status as compiled_status
from gateway.fleet.errors import CommandRejectedError
from gateway.fleet.models import (
    CAPACITY_SLACK,
    AdmissionDecision,
    AgentCommand,
    CallSnapshot,
    OriginateRequest,
    ProfileModel,
    TransferLine,
    WarmTransferRequest,
    WorkerEvent,
    WorkerInfo,
)
from gateway.fleet.protocols import ControlLink
from gateway.heap import freeze_startup_heap
from gateway.media.ahead import OpusAheadPolicy
from gateway.media.tick import OutboundFrame, TickEngine
from gateway.observability import (
    CALLER_AUDIO_WAIT_SECONDS,
    CAPACITY,
    CAPACITY_USED,
    GC_PAUSE_SECONDS,
    LOOP_LAG_SECONDS,
    OPUS_CALLS_AHEAD,
    SIP_TLS_CERTIFICATE_EXPIRY,
    TICK_OVERRUNS_TOTAL,
    TICK_SECONDS,
    TICKS_SKIPPED_TOTAL,
)
from gateway.providers.base import RealtimeModel
from gateway.session.amd_listen import GreetingTranscribing
from gateway.session.config import SessionConfig
from gateway.sip.auth import ClientCredentials
from gateway.sip.config import SipConfig
from gateway.slices import SLICE_S, Slices
from gateway.tasks import TaskSet
from gateway.transport.clock import MediaClock
from gateway.worker.agent_control import command_session
from gateway.worker.assemble import assemble_worker
from gateway.worker.counters import CounterExporter, live_call_figures
from gateway.worker.legs import LegState
from gateway.worker.settings import WorkerSettings
from gateway.worker.sip_leg import LEVEL_EVERY_TICKS, CallLeg
from gateway.worker.webrtc import WebRtcSettings
from telcodecs.frames import dbfs

log = logging.getLogger(__name__)

ModelFactory = Callable[[str], RealtimeModel]
_DEFAULT_PROFILE = ProfileModel(name="default", provider="default")
_RTP_CHECK_EVERY_TICKS = 50  # inactivity and RTCP bookkeeping once a second


# Every collector pass in the process is timed (young ones run many times a second): children looked up once.
_GC_PAUSES = {
    (g, paced): GC_PAUSE_SECONDS.labels(str(g), "tick" if paced else "other")
    for g in range(3)
    for paced in (True, False)
}


def _observe_gc_pass(generation: int, seconds: float, paced: bool) -> None:
    _GC_PAUSES[generation, paced].observe(seconds)


class MediaWorker:
    """One worker process part. Implements :class:`gateway.fleet.protocols.WorkerCommands`."""

    def __init__(
        self,
        settings: WorkerSettings,
        *,
        model_factory: ModelFactory,
        link: ControlLink | None = None,
        session_config: SessionConfig | None = None,
        sip_config: SipConfig | None = None,
        url: str = "",
        heartbeat_s: float = 1.0,
        trunk_credentials: ClientCredentials | None = None,
        default_profile: ProfileModel | None = None,
        webrtc_settings: WebRtcSettings | None = None,
        amd_recognisers: GreetingTranscribing | None = None,
    ) -> None:
        self.settings = settings
        self.id = settings.worker_id
        self.url = url
        self._model_factory = model_factory
        # Builds the recogniser a profile names in amd_stt (AMD's words); None: the provider's own, if any.
        self.amd_recognisers = amd_recognisers
        # The agent profile of calls admitted without a control plane (which otherwise picks it per route).
        self.default_profile = default_profile or _DEFAULT_PROFILE
        self._models: dict[str, RealtimeModel] = {}
        self.link = link
        self.session_config = session_config or settings.session.session_config()
        self.counters = CounterExporter(settings.worker_id)
        self._tasks = TaskSet(f"worker {settings.worker_id}")
        self.closing = False
        # Raises TlsConfigError (unusable certificate files) or OSError (a self-signed pair cannot be written).
        parts = assemble_worker(
            settings,
            self,
            sip=sip_config,
            trunk_credentials=trunk_credentials,
            webrtc_settings=webrtc_settings,
            observe_gc=_observe_gc_pass,
        )
        self.parts = parts
        self.endpoint = parts.signalling.endpoint
        self.sip = parts.transport
        self.sip_tls = parts.sip_tls
        self.plant = parts.plant
        self.ports = parts.plant.ports
        # With rtp_read_at_tick: every call's RTP socket, read at the start of each tick (ADR 0007); None: read per
        # readiness callback (ADR 0002).
        self.rtp_drain = parts.plant.rtp_drain
        self.routes = parts.plant.routes  # every call whose media is in the engine (kept by SipCalls)
        self.legs = parts.legs  # every call, SIP and browser
        self.sip_calls = parts.sip_calls
        self.webrtc = parts.webrtc  # browser callers (gateway/worker/webrtc.py)
        self.drainer = parts.drain
        self.registration = parts.registration  # with GATEWAY_TRUNK_REGISTER (gateway/worker/registration.py)
        # Full collector passes, run after a tick when no call is live or rarely (ADR 0010); None: CPython's own.
        self.collector = parts.collector
        self.exited = parts.drain.exited  # set once a worker draining to exit carries no call
        self.clock = MediaClock(self._on_tick, on_measured=self._on_tick_measured, on_skipped=self._on_ticks_skipped)
        self._heartbeat_s = heartbeat_s
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._counters_task: asyncio.Task[None] | None = None
        self._control_ok_at: float | None = None  # monotonic time of the last registration or heartbeat answered
        self._tick_no = 0
        # Walks of every call off the tick (snapshots, the counters' export) let the loop in this often.
        self.slice_s = SLICE_S
        self._opus_ahead = OpusAheadPolicy(settings.media.opus_encode_ahead_ms / 1000)
        self._started = False
        self._metric_worker = settings.worker_id
        self._caller_audio_wait = CALLER_AUDIO_WAIT_SECONDS.labels(settings.worker_id)

    @property
    def engine(self) -> TickEngine:
        return self.plant.engine

    @engine.setter
    def engine(self, engine: TickEngine) -> None:  # the bench's per-call design, before the worker starts
        self.plant.engine = engine

    @property
    def draining(self) -> bool:
        return self.drainer.draining

    def _sip_legs(self) -> list[CallLeg]:
        return [leg for leg in self.legs.values() if isinstance(leg, CallLeg)]

    async def start(self) -> None:
        await self.sip.start()
        freeze_startup_heap()
        if self.collector is not None:
            self.collector.open()
        self.clock.start()
        self._started = True
        self.registration.start()
        self._counters_task = asyncio.create_task(self._counters_loop(), name=f"worker-{self.id}-counters")
        if self.link is not None:
            try:
                await self.link.register(self.info())
            except Exception as exc:  # a control plane that starts later takes the worker in at its first heartbeat
                log.warning("cannot register with the control plane yet (%s); heartbeats will keep trying", exc)
            else:
                self._control_ok_at = time.monotonic()
            self._heartbeat_task = asyncio.create_task(self._heartbeat_loop(), name=f"worker-{self.id}-heartbeat")
        log.info(
            "worker %s: SIP on %s:%d (%s%s), RTP %s, capacity %d, %s",
            self.id,
            self.settings.sip.sip_host,
            self.sip.port,
            "+".join(self.settings.sip.sip_transports),
            f"; TLS on {self.sip.tls_port}" if "tls" in self.settings.sip.sip_transports else "",
            self.settings.media.rtp_ports,
            self.settings.costs.capacity,
            compiled_status(),
        )

    async def aclose(self, reason: str = "shutdown") -> None:
        """BYE to every live call, wait (bounded) for their sessions, then stop SIP, the clock and tasks."""
        if self.closing:
            return
        self.closing = True
        self.registration.begin_unregister(reason)  # first: the trunk stops sending calls here
        self.sip_calls.closing = True
        for leg in self._sip_legs():
            leg.hang_up(reason)
        pending = [leg.task for leg in self._sip_legs() if leg.task is not None]
        if pending:
            await asyncio.wait(pending, timeout=5.0)
        self.sip_calls.referrals.aclose()  # referrers still on a transferred call are sent their BYE now
        await self.webrtc.aclose(reason)  # browser calls
        if self._counters_task is not None:
            self._counters_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._counters_task
            self.export_counters()
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._heartbeat_task
        if self.link is not None:  # an orderly exit is "gone", not "lost" (which alerts)
            with contextlib.suppress(Exception):
                await self.link.report([WorkerEvent(type="worker.gone", worker=self.id, time=time.time())])
        await self.registration.unregister(reason)  # bounded: GATEWAY_TRUNK_UNREGISTER_TIMEOUT_S
        await self._tasks.aclose()
        await self.sip.aclose()
        self.clock.stop()
        if self.collector is not None:
            self.collector.close()
        for leg in self._sip_legs():
            self.sip_calls.release_media(leg)
        if self.plant.recordings is not None:
            await self.plant.recordings.aclose()  # recordings of calls that outlived the wait are closed whole
        if self.rtp_drain is not None:
            self.rtp_drain.close()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return self._tasks.spawn(coro, name)

    def capacity_used(self) -> float:
        """What the live calls take of ``settings.capacity``: 1 per G.711 call, ``settings.opus_call_cost`` per
        Opus SIP call (``settings.call_cost``) and ``settings.webrtc_call_cost`` per browser call."""
        return self.legs.capacity_used()

    def over_capacity(self) -> bool:
        return self.capacity_used() > self.settings.costs.capacity + CAPACITY_SLACK

    def info(self) -> WorkerInfo:
        active = self.legs.live_count()
        used = self.capacity_used()
        return WorkerInfo(
            id=self.id,
            url=self.url,
            capacity=self.settings.costs.capacity,
            active_calls=active,
            used=used,
            load=used / self.settings.costs.capacity,
            draining=self.draining,
            status="draining" if self.draining else "up",
            version=__version__,
            registration=self.registration.info(),
            registrations=self.registration.infos(),
        )

    def heartbeat_soon(self) -> None:
        """Tell the control plane now, not at the next beat (a drain that began here: readiness follows)."""
        if self.link is not None and self._started and not self.closing:
            self.spawn(self._heartbeat_once(), name=f"worker-{self.id}-heartbeat-now")

    async def _heartbeat_once(self) -> None:
        assert self.link is not None
        try:
            await self.link.heartbeat(self.info(), await self.snapshot())
        except Exception as exc:  # the control plane may be restarting: keep carrying calls
            log.warning("heartbeat to the control plane failed: %s", exc)
        else:
            self._control_ok_at = time.monotonic()

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat_s)
            await self._heartbeat_once()

    def readiness(self) -> dict[str, Any]:
        """What the worker's ``/readyz`` answers: ready while it takes calls (not draining or closing) and its
        control plane answered a heartbeat within three intervals (without it no call is admitted)."""
        if self.link is None:
            reachable = True
        else:
            ok_at = self._control_ok_at
            reachable = ok_at is not None and time.monotonic() - ok_at <= 3 * self._heartbeat_s + 1.0
        ready = self._started and not self.draining and not self.closing and reachable
        return {
            "ready": ready,
            "draining": self.draining,
            "control_reachable": reachable,
            "live_calls": self.live_calls(),
        }

    async def _counters_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                await self.export_counters_in_slices()
            except Exception:  # metrics must never take a worker down
                log.exception("exporting counters failed")

    def export_counters(self) -> None:
        """Push the SIP and media cores' counters into the Prometheus registry (see counters.py), at once."""
        for leg in self._export_totals():
            self._export_call(leg)

    async def export_counters_in_slices(self) -> None:
        """:meth:`export_counters` with the loop let in between calls (the once-a-second export walks every
        call: 1–3 ms at 400 calls in one stretch). A call that ended meanwhile was exported by its end."""
        slices = Slices(self.slice_s)
        legs = self.legs
        for leg in self._export_totals():
            if legs.get(leg.id) is leg:
                self._export_call(leg)
                await slices.next()

    def _export_totals(self) -> list[CallLeg]:
        """Everything but the SIP calls' own figures; returns the calls whose figures are to be exported."""
        self.counters.sip(self.endpoint.stats)
        self.counters.sip_transport(self.sip.stats, self.sip.connection_counts())
        if self.sip_tls is not None and self.sip_tls.not_after is not None:
            SIP_TLS_CERTIFICATE_EXPIRY.labels(self._metric_worker).set(self.sip_tls.not_after)
        self.counters.rtp_dropped(self.engine.dropped)
        self.counters.opus_moves(self.engine.opus_moves)
        received, sent = self.sip_calls.rtp_in_done, self.sip_calls.rtp_out_done
        media_legs = []
        for leg in self._sip_legs():
            if leg.rtp is not None:
                received += leg.rtp.stats.received
                sent += leg.rtp.stats.sent
            if leg.media_added:
                media_legs.append(leg)
        self.counters.calls(self.webrtc.figures())
        self.counters.rtp_packets(received, sent)
        CAPACITY.labels(self._metric_worker).set(self.settings.costs.capacity)
        CAPACITY_USED.labels(self._metric_worker).set(self.capacity_used())
        OPUS_CALLS_AHEAD.labels(self._metric_worker).set(self.engine.opus_calls_ahead)
        return media_legs

    def _export_call(self, leg: CallLeg) -> None:
        gaps = leg.session.agent_audio_gaps if leg.session is not None else 0
        self.counters.calls((live_call_figures(leg.id, self.engine.call(leg.id), agent_audio_gaps=gaps),))

    def model_for(self, provider: str) -> RealtimeModel:
        model = self._models.get(provider)
        if model is None:
            model = self._model_factory(provider)
            self._models[provider] = model
        return model

    def clock_now(self) -> float:
        return asyncio.get_running_loop().time()

    def _on_tick(self, deadline: float) -> None:
        engine = self.engine
        if not len(engine):
            if self.rtp_drain is not None:
                self.rtp_drain.drain()
            return
        now = deadline
        self._tick_no += 1
        routes = self.routes
        # The caller's half first: every call's frame is encoded and sent at the start of the tick, so its packets
        # leave at the same point of every tick, whatever the inbound half costs that tick.
        outbound: dict[str, OutboundFrame] = {}
        frame: OutboundFrame
        recordings = self.plant.recordings
        recorders = recordings.recorders if recordings is not None else None
        for call_id, takes_g711 in engine.takes_g711:
            route = routes.get(call_id)
            session = route.session if route is not None else None
            recorder = recorders.get(call_id) if recorders else None
            if route is not None and (early := route.early) is not None:  # before the 200 OK (early_media.py)
                if early.plays:
                    frame = early.next_frame(self._tick_no)
                else:
                    frame = session.pull_outbound(takes_g711=takes_g711) if session is not None else None
                    early.sending(frame)
            else:
                if route is not None and (bridge := route.bridge) is not None and bridge.joined:
                    # Bridged (warm transfer): the other leg's audio, the agent out of the path (bridge.py).
                    frame = bridge.frame_for(call_id)
                else:
                    # The recording notice first (the session's audio waits for it). A G.711 caller may be handed
                    # the provider's G.711 codes without PCM (sent as they are or via tables).
                    frame = recorder.notice_frame(self._tick_no) if recorder is not None else None
                    if frame is None and session is not None:
                        frame = session.pull_outbound(takes_g711=takes_g711)
                if route is not None and (inband := route.inband) is not None and inband.sending:
                    # In-band DTMF (the agent's, or the other bridged leg's digit on a leg without RFC 4733)
                    # replaces the audio, as RFC 4733 packets do.
                    frame = inband.next_frame()
            if recorder is not None:
                recorder.agent = frame  # what is sent is recorded
            outbound[call_id] = frame
        opus = engine.has_opus
        started = perf_counter() if opus else 0.0
        datagrams = engine.tick_outbound(outbound, now)
        encoding = perf_counter() - started if opus else 0.0
        for call_id, destination, data in datagrams:
            route = routes.get(call_id)
            if route is not None:
                route.rtp.send_rtp(data, destination)
        if self.rtp_drain is not None:
            self.rtp_drain.drain()  # caller audio since the last tick, into the jitter buffers before they pop
        inbound = engine.tick_inbound(now)
        level_phase = self._tick_no % LEVEL_EVERY_TICKS  # the calls whose turn it is to have their level sampled
        probes = inbound.probes  # one packet per call per second: arrival -> its frame handed to the provider
        loop_time = asyncio.get_running_loop().time
        for call_id, frame in inbound.frames.items():
            route = routes.get(call_id)
            if route is None:
                continue
            if (early := route.early) is not None:
                early.received(frame)  # early media is one-way: counted and recorded, never passed on
                if recorders and (recorder := recorders.get(call_id)) is not None:
                    recorder.caller = frame
                continue
            if (bridge := route.bridge) is not None:
                bridge.heard(call_id, frame)  # a warm transfer's leg: to the other leg, not to an agent
            elif (session := route.session) is not None:
                session.push_inbound(frame)  # written to the provider now when the connection takes it at once
                if (inband := route.inband) is not None:
                    for digit in inband.heard(frame.pcm):
                        session.dtmf_received(digit)
            else:
                continue
            if recorders and (recorder := recorders.get(call_id)) is not None:
                recorder.caller = frame
            if probes and (arrived := probes.get(call_id)) is not None:
                self._caller_audio_wait.observe(loop_time() - arrived)
            if route.level_phase == level_phase:
                leg = route.leg
                leg.last_level = level = max(dbfs(frame.pcm), -100.0)
                leg.levels.append(level)
        if recorders and recordings is not None:
            recordings.tick(self._tick_no)  # this tick's frames of every recorded call, to the writer thread
        for dtmf in inbound.events:
            route = routes.get(dtmf.call_id)
            if route is None:
                continue
            if (bridge := route.bridge) is not None and bridge.joined:
                self.sip_calls.bridged_dtmf(bridge, dtmf.call_id, dtmf.digit)
            elif route.session is not None:
                route.session.dtmf_received(dtmf.digit)
        for call_id, destination, data in engine.rtcp_due(now):
            route = routes.get(call_id)
            if route is not None:
                route.rtp.send_rtcp(data, destination)
        if opus:
            # Opus calls encoded a tick ahead: their frames, for the start of the next tick (gateway/media/ahead.py).
            started = perf_counter()
            engine.encode_ahead()
            ahead = self._opus_ahead.observed(encoding + perf_counter() - started)
            if ahead != engine.opus_ahead:
                engine.opus_ahead = ahead
                log.info(
                    "Opus callers' frames are encoded %s: a tick's outbound encoding took %.2f ms at the 90th "
                    "percentile over the last second (GATEWAY_OPUS_ENCODE_AHEAD_MS=%g)",
                    "a tick ahead from their next pause" if ahead else "in their tick again from their next pause",
                    self._opus_ahead.last_p90 * 1000,
                    self.settings.media.opus_encode_ahead_ms,
                )
        if self._tick_no % _RTP_CHECK_EVERY_TICKS == 0:
            self._check_inactivity(now)

    def _check_inactivity(self, now: float) -> None:
        timeout = self.settings.media.rtp_timeout_s
        for leg in self._sip_legs():
            if not leg.media_added or leg.state is not LegState.ACTIVE or leg.negotiated is None:
                continue
            if leg.negotiated.on_hold or leg.negotiated.direction in ("sendonly", "inactive"):
                continue
            if self.engine.inactive_for(leg.id, now) > timeout:
                log.info("call %s: no RTP for %.0f s", leg.id, timeout)
                leg.hang_up("rtp_timeout")

    def _on_tick_measured(self, lag: float, duration: float, overrun: bool) -> None:
        TICK_SECONDS.labels(self._metric_worker).observe(duration)
        LOOP_LAG_SECONDS.labels(self._metric_worker).observe(max(lag, 0.0))
        if overrun:
            TICK_OVERRUNS_TOTAL.labels(self._metric_worker).inc()
        if self.collector is not None:
            self.collector.after_tick(idle=not self.legs, late=overrun)

    def _on_ticks_skipped(self, ticks: int) -> None:
        self.engine.skip_ticks(ticks)  # the phones see a gap in the timestamps, not every later packet late
        TICKS_SKIPPED_TOTAL.labels(self._metric_worker).inc(ticks)

    async def hang_up(self, call_id: str, reason: str) -> None:
        self.legs.find(call_id).hang_up(reason)

    async def transfer(self, call_id: str, target: str) -> None:
        self.legs.find(call_id).transfer(target)

    async def send_dtmf(self, call_id: str, digits: str) -> None:
        self.legs.find(call_id).send_dtmf(digits)

    async def hold(self, call_id: str, held: bool) -> None:
        self.legs.find(call_id).hold(held)

    async def warm_transfer(self, call_id: str, request: WarmTransferRequest) -> TransferLine:
        """A warm transfer of the caller to a human (gateway/worker/warm.py); returns once their phone rings."""
        leg = self.legs.find(call_id)
        if not isinstance(leg, CallLeg):
            raise CommandRejectedError(f"call {call_id}: a browser call cannot be transferred")
        return await self.sip_calls.start_warm_transfer(leg, request, initiator="api")

    async def warm_transfer_join(self, call_id: str) -> TransferLine:
        """Join a warm transfer's caller and human now (gateway/worker/warm.py)."""
        leg = self.legs.find(call_id)
        if not isinstance(leg, CallLeg):
            raise CommandRejectedError(f"call {call_id} has no warm transfer")
        return self.sip_calls.warm.force_join(leg).line()

    async def command_agent(self, call_id: str, command: AgentCommand) -> None:
        """Live call control of the call's session (gateway/worker/agent_control.py)."""
        leg = self.legs.find(call_id)
        await command_session(leg, command, model_for=self.model_for, context=leg.context)

    async def drain(self, exit_when_empty: bool, deadline_s: float | None = None) -> None:
        """Take no new calls; end those left ``deadline_s`` from now, politely (gateway/worker/drain.py)."""
        self.drainer.begin(exit_when_empty=exit_when_empty, deadline_s=deadline_s)

    def call_ended(self) -> None:
        self.drainer.check_empty()

    def live_calls(self) -> int:
        return self.legs.live_count()

    async def originate(self, request: OriginateRequest, admission: AdmissionDecision) -> str:
        """Place an outbound SIP call (see :meth:`SipCalls.originate`); returns the call id at once."""
        return await self.sip_calls.originate(request, admission)

    def snapshot_of(self, leg: CallLeg) -> CallSnapshot:
        return self.sip_calls.snapshot_of(leg)

    async def snapshot(self) -> list[CallSnapshot]:
        """Every call's snapshot, SIP and browser. Built in slices with the loop let in between: the heartbeat
        takes one of every call each second, and at hundreds of calls that pydantic work in one stretch held the
        media tick (docs/performance/2026-12-03-ops-slices.md). A call that ended meanwhile is left out,
        as if it had ended before."""
        slices = Slices(self.slice_s)
        legs = self.legs
        snapshots: list[CallSnapshot] = []
        for leg in list(legs.values()):
            if legs.get(leg.id) is leg:
                snapshots.append(await leg.snapshot())
                await slices.next()
        return snapshots
