"""The media worker: SIP signalling, RTP sockets, the shared 20 ms tick and one CallSession per call.

Inbound call: ``CallOffered`` -> admission by the control plane (route -> agent profile) -> SDP offer/answer
-> an RTP port pair -> media state in the tick engine -> 200 OK -> a CallSession that connects to the
provider while caller frames are already held. The call ends when either side hangs up, the session ends
it (tool, max duration, provider unavailable), RTP stops arriving, or the ops API asks; every path meets in
:meth:`MediaWorker._finish`, which is idempotent and releases everything the call held.

The tick (``_on_tick``) runs at absolute deadlines from :class:`~gateway.transport.clock.MediaClock`:
inbound frames to sessions, one outbound frame from each session, batched DSP in the tick engine, RTP out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections.abc import Callable
from dataclasses import replace

from gateway import __version__
from gateway.fleet.models import (
    AdmissionDecision,
    AdmissionRequest,
    CallSnapshot,
    OriginateRequest,
    ProfileModel,
    WorkerEvent,
    WorkerInfo,
)
from gateway.fleet.protocols import ControlLink
from gateway.media.call import MediaCallConfig
from gateway.media.errors import LocalMediaError
from gateway.media.tick import TickEngine
from gateway.observability import (
    ACTIVE_CALLS,
    CALL_SETUP_SECONDS,
    CALLS_TOTAL,
    LOOP_LAG_SECONDS,
    TICK_OVERRUNS_TOTAL,
    TICK_SECONDS,
)
from gateway.providers.base import RealtimeModel
from gateway.session.config import SessionConfig, WebhookToolConfig
from gateway.session.session import CallSession
from gateway.sip.auth import ClientCredentials
from gateway.sip.config import RateLimit, SessionTimerConfig, SipConfig
from gateway.sip.endpoint import SipEndpoint
from gateway.sip.errors import RemoteProtocolError
from gateway.sip.events import (
    CallCancelled,
    CallEnded,
    CallEstablished,
    CallHandle,
    CallOffered,
    DtmfInfoReceived,
    OutboundCallAnswered,
    OutboundCallFailed,
    ReinviteReceived,
    SipEvent,
    TransferFailed,
    TransferProgressed,
)
from gateway.sip.sdp import (
    LocalMedia,
    NoCommonCodec,
    SdpError,
    build_answer,
    build_offer,
    negotiate,
    parse_sdp,
)
from gateway.transport.clock import MediaClock
from gateway.transport.rtp_socket import PortsExhaustedError, RtpPortPool, RtpPortRange
from gateway.transport.sip_transport import SipTransport
from gateway.worker.counters import CounterExporter
from gateway.worker.legs import LEVEL_EVERY_TICKS, CallLeg, SipCallControl
from gateway.worker.reporting import build_snapshot, level_fields, media_fields, user_part
from gateway.worker.settings import WorkerSettings
from gateway.worker.webrtc import WebRtcCalls
from telcodecs.frames import dbfs

log = logging.getLogger(__name__)

ModelFactory = Callable[[str], RealtimeModel]
_DEFAULT_PROFILE = ProfileModel(name="default", provider="default")
_RTP_CHECK_EVERY_TICKS = 50  # inactivity and RTCP bookkeeping once a second


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
    ) -> None:
        self.settings = settings
        self.id = settings.worker_id
        self.url = url
        self._model_factory = model_factory
        self._models: dict[str, RealtimeModel] = {}
        self.link = link
        self.session_config = session_config or SessionConfig(tool_grace_s=settings.tool_grace_s)
        self.sip_config = sip_config or self._sip_config(settings)
        self.endpoint = SipEndpoint(self.sip_config)
        self.sip = SipTransport(
            self.endpoint,
            host=settings.sip_host,
            port=settings.sip_port,
            transports=settings.sip_transports,
            on_events=self._on_sip_events,
        )
        first, last = settings.rtp_port_bounds
        self.ports = RtpPortPool(RtpPortRange(host=settings.media_host, first=first, last=last))
        self.engine = TickEngine(wall_clock_offset=time.time() - time.monotonic())
        self.clock = MediaClock(self._on_tick, on_measured=self._on_tick_measured)
        self.legs: dict[str, CallLeg] = {}
        self._by_handle: dict[CallHandle, CallLeg] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._heartbeat_s = heartbeat_s
        self._heartbeat_task: asyncio.Task[None] | None = None
        self._counters_task: asyncio.Task[None] | None = None
        self.counters = CounterExporter(settings.worker_id)
        # Packets counted on the sockets of calls that have ended (the live ones are summed each export).
        self._rtp_in_done = 0
        self._rtp_out_done = 0
        if trunk_credentials is None and settings.trunk_user and settings.trunk_password:
            from gateway.sip.auth import DigestClientCredentials

            trunk_credentials = DigestClientCredentials(username=settings.trunk_user, password=settings.trunk_password)
        self._trunk_credentials = trunk_credentials
        self.draining = False
        self._exit_when_empty = False
        self.exited = asyncio.Event()
        self._tick_no = 0
        self._started = False
        self._closing = False
        self._metric_worker = settings.worker_id
        self.webrtc = WebRtcCalls(self)  # browser callers (gateway/worker/webrtc.py)

    @staticmethod
    def _sip_config(settings: WorkerSettings) -> SipConfig:
        authenticator = None
        if settings.sip_auth_user is not None and settings.sip_auth_password is not None:
            from gateway.sip.auth import DigestAuthenticator
            from gateway.sip.digest import DigestChallenger

            authenticator = DigestAuthenticator(
                DigestChallenger(
                    realm=settings.sip_auth_realm,
                    credentials={settings.sip_auth_user: settings.sip_auth_password}.get,
                    nonce_secret=secrets.token_bytes(32),
                )
            )
        return SipConfig(
            local_host=settings.sip_host,
            local_port=settings.sip_port,
            advertised_host=settings.advertised_host,
            advertised_port=settings.advertised_sip_port,
            transports=settings.sip_transports,
            user_agent=settings.user_agent,
            allow_cidrs=settings.sip_allow,
            authenticator=authenticator,
            rate_limit=RateLimit(
                per_second=settings.sip_rate_limit_per_s, burst=int(settings.sip_rate_limit_per_s * 2)
            ),
            session_timer=SessionTimerConfig(session_expires=settings.session_expires_s),
            max_calls=max(settings.capacity * 2, 10),
        )

    # ------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.sip.start()
        self.clock.start()
        self._started = True
        self._counters_task = asyncio.create_task(self._counters_loop(), name=f"worker-{self.id}-counters")
        if self.link is not None:
            await self.link.register(self.info())
            self._heartbeat_task = asyncio.create_task(self._heartbeat_loop(), name=f"worker-{self.id}-heartbeat")
        log.info(
            "worker %s: SIP on %s:%d (%s), RTP %s, capacity %d",
            self.id,
            self.settings.sip_host,
            self.sip.port,
            "+".join(self.settings.sip_transports),
            self.settings.rtp_ports,
            self.settings.capacity,
        )

    async def aclose(self, reason: str = "shutdown") -> None:
        """BYE to every live call, wait (bounded) for their sessions, then stop SIP, the clock and tasks."""
        if self._closing:
            return
        self._closing = True
        for leg in list(self.legs.values()):
            self.hang_up_leg(leg, reason)
        pending = [leg.task for leg in self.legs.values() if leg.task is not None]
        if pending:
            await asyncio.wait(pending, timeout=5.0)
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
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        await self.sip.aclose()
        self.clock.stop()
        for leg in list(self.legs.values()):
            self._release_media(leg)

    def _spawn(self, coro: object, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)  # type: ignore[arg-type]
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("worker task %s failed", task.get_name(), exc_info=task.exception())

    def info(self) -> WorkerInfo:
        active = sum(1 for leg in self.legs.values() if leg.live) + self.webrtc.live_count  # + browser calls
        return WorkerInfo(
            id=self.id,
            url=self.url,
            capacity=self.settings.capacity,
            active_calls=active,
            load=active / self.settings.capacity,
            draining=self.draining,
            status="draining" if self.draining else "up",
            version=__version__,
        )

    async def _heartbeat_loop(self) -> None:
        assert self.link is not None
        while True:
            await asyncio.sleep(self._heartbeat_s)
            try:
                await self.link.heartbeat(self.info(), await self.snapshot())
            except Exception as exc:  # the control plane may be restarting: keep carrying calls
                log.warning("heartbeat to the control plane failed: %s", exc)

    async def _counters_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            try:
                self.export_counters()
            except Exception:  # metrics must never take a worker down
                log.exception("exporting counters failed")

    def export_counters(self) -> None:
        """Push the SIP and media cores' counters into the Prometheus registry (see counters.py)."""
        self.counters.sip(self.endpoint.stats)
        self.counters.rtp_dropped(self.engine.dropped)
        received, sent = self._rtp_in_done, self._rtp_out_done
        now = self.clock_now()
        per_call = []
        for leg in self.legs.values():
            if leg.rtp is not None:
                received += leg.rtp.stats.received
                sent += leg.rtp.stats.sent
            if leg.media_added:
                media = self.engine.stats(leg.id, now)
                per_call.append((leg.id, media.lost, media.jitter_ms))
        self.counters.rtp_packets(received, sent)
        self.counters.rtp_calls(per_call)

    def _model(self, provider: str) -> RealtimeModel:
        model = self._models.get(provider)
        if model is None:
            model = self._model_factory(provider)
            self._models[provider] = model
        return model

    # ------------------------------------------------------------------------------------ SIP events

    def _on_sip_events(self, events: list[SipEvent]) -> None:
        for event in events:
            if isinstance(event, CallOffered):
                self._offered(event)
                continue
            leg = self._by_handle.get(event.call) if hasattr(event, "call") else None  # type: ignore[arg-type]
            if leg is None:
                continue
            if isinstance(event, CallEstablished):
                self._established(leg, event)
            elif isinstance(event, CallEnded):
                reason = "caller_hangup" if event.by == "remote" else (leg.end_reason or event.reason)
                if event.status is not None and event.by == "remote":
                    reason = f"sip_{event.status}"
                self._begin_finish(leg, reason)
            elif isinstance(event, CallCancelled):
                self._begin_finish(leg, "caller_cancelled")
            elif isinstance(event, DtmfInfoReceived):
                if leg.session is not None:
                    leg.session.dtmf_received(event.digit, duration_ms=event.duration_ms)
            elif isinstance(event, ReinviteReceived):
                self._reinvite(leg, event)
            elif isinstance(event, TransferProgressed):
                leg.transfer_seen_progress = True
                if event.final and leg.transfer is not None and not leg.transfer.done():
                    from gateway.session.control import TransferOutcome

                    leg.transfer.set_result(TransferOutcome(status="accepted", sip_status=event.status))
            elif isinstance(event, TransferFailed):
                if leg.transfer is not None and not leg.transfer.done():
                    from gateway.session.control import TransferOutcome

                    status = "failed" if leg.transfer_seen_progress else "refused"
                    leg.transfer.set_result(
                        TransferOutcome(status=status, sip_status=event.status, detail=event.reason)  # type: ignore[arg-type]
                    )
            elif isinstance(event, OutboundCallAnswered):
                self._outbound_answered(leg, event)
            elif isinstance(event, OutboundCallFailed):
                leg.end_reason = f"sip_{event.status}"
                if leg.answered is not None and not leg.answered.done():
                    leg.answered.set_result(False)
                self._begin_finish(leg, f"sip_{event.status}")

    def _offered(self, event: CallOffered) -> None:
        leg = CallLeg(
            id=f"c-{secrets.token_hex(6)}",
            sip=event.call,
            direction="inbound",
            from_uri=event.from_uri,
            to_uri=event.to_uri,
            source=f"{event.source[0]}:{event.source[1]}",
        )
        self.legs[leg.id] = leg
        self._by_handle[event.call] = leg
        leg.task = self._spawn(self._run_inbound(leg, event), name=f"call-{leg.id}")

    # -------------------------------------------------------------------------------- inbound calls

    def _reject(
        self, leg: CallLeg, status: int, reason: str, *, end_reason: str, retry_after: int | None = None
    ) -> None:
        # Set before the answer goes out: the endpoint reports CallEnded at once, and its reason phrase
        # (free text, e.g. naming the dialled number) must not become the end reason or a metric label.
        if not leg.end_reason:
            leg.end_reason = end_reason
        if leg.sip is None:
            return
        headers = (("Retry-After", str(retry_after)),) if retry_after else ()
        with contextlib.suppress(RemoteProtocolError, Exception):
            self.endpoint.reject(leg.sip, self.sip.now(), status=status, reason=reason, headers=headers)
        self.sip.pump()

    async def _admit(self, leg: CallLeg, *, called: str, caller: str) -> AdmissionDecision:
        if self.draining or self._closing:
            return AdmissionDecision(
                accepted=False, status=503, code="draining", reason="worker draining", retry_after_s=5
            )
        if sum(1 for other in self.legs.values() if other.live) > self.settings.capacity:
            return AdmissionDecision(
                accepted=False, status=503, code="over_capacity", reason="worker full", retry_after_s=5
            )
        if self.link is None:
            return AdmissionDecision(
                accepted=True, call_id=leg.id, worker=self.id, route="default", profile=_DEFAULT_PROFILE
            )
        request = AdmissionRequest(
            called=called,
            caller=caller,
            source=leg.source,
            kind="sip",
            direction=leg.direction,
            worker=self.id,
            call_id=leg.id,
        )
        try:
            return await self.link.admit(request)
        except Exception as exc:
            log.warning("admission for %s failed: %s", leg.id, exc)
            return AdmissionDecision(
                accepted=False, status=503, code="no_control", reason="control plane unreachable", retry_after_s=5
            )

    async def _run_inbound(self, leg: CallLeg, event: CallOffered) -> None:
        try:
            decision = await self._admit(leg, called=user_part(event.to_uri), caller=user_part(event.from_uri))
            if leg.state != "admitted":  # cancelled or hung up while the control plane decided
                return
            if not decision.accepted:
                status = {403: 403, 404: 404}.get(decision.status, 503)
                rejected = f"rejected_{decision.code or status}"
                self._reject(
                    leg,
                    status,
                    decision.reason or "not admitted",
                    end_reason=rejected,
                    retry_after=decision.retry_after_s,
                )
                self._begin_finish(leg, rejected)
                return
            leg.route = decision.route
            leg.profile = decision.profile or _DEFAULT_PROFILE
            if not self._prepare_media(leg, event.body):
                return
            assert leg.sip is not None and leg.local_sdp is not None
            self._make_session(leg)  # holds caller frames from the first one on, while it connects
            self.endpoint.answer(leg.sip, self.sip.now(), body=leg.local_sdp.to_bytes())
            self.sip.pump()
            leg.state = "active"
            leg.answered_wall = time.time()
            CALL_SETUP_SECONDS.labels(self._metric_worker).observe(time.monotonic() - leg.started_mono)
            ACTIVE_CALLS.labels(self._metric_worker).inc()
            log.info(
                "call %s answered: %s -> %s (%s, route %s)",
                leg.id,
                leg.from_uri,
                leg.to_uri,
                self._codec(leg),
                leg.route,
            )
            await self._report("call.started", leg)
            await self._run_session(leg)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("call %s failed", leg.id)
            self.hang_up_leg(leg, "internal_error")
        finally:
            await self._finish(leg, leg.end_reason or "ended")

    def _prepare_media(self, leg: CallLeg, offer_body: bytes) -> bool:
        """Negotiate the offer (or prepare our offer for a late-offer INVITE), open RTP, add media state."""
        try:
            rtp = self.ports.allocate()
        except PortsExhaustedError:
            self._reject(leg, 503, "no media ports", end_reason="no_media_ports", retry_after=5)
            self._begin_finish(leg, "no_media_ports")
            return False
        leg.rtp = rtp
        session_id = random.getrandbits(31)
        public = self.settings.advertised_host or rtp.host
        if not offer_body:
            leg.local_sdp = build_offer(
                local_address=public,
                local_port=rtp.port,
                session_id=session_id,
                session_version=1,
                preferences=self.settings.codecs,
            )
            return True  # media starts when the ACK brings the answer
        try:
            offer = parse_sdp(offer_body)
            negotiated = negotiate(offer, local=LocalMedia(), preferences=self.settings.codecs)
        except NoCommonCodec as exc:
            self._reject(leg, 488, "no common codec", end_reason="no_common_codec")
            self._begin_finish(leg, "no_common_codec")
            log.info("call %s: %s", leg.id, exc)
            return False
        except SdpError as exc:
            self._reject(leg, 488, "malformed SDP", end_reason="bad_sdp")
            self._begin_finish(leg, "bad_sdp")
            log.info("call %s: bad SDP: %s", leg.id, exc)
            return False
        leg.remote_sdp = offer
        leg.negotiated = negotiated
        leg.local_sdp = build_answer(
            offer, negotiated, local_address=public, local_port=rtp.port, session_id=session_id, session_version=1
        )
        self._start_media(leg)
        return True

    def _start_media(self, leg: CallLeg) -> None:
        negotiated = leg.negotiated
        assert negotiated is not None and leg.rtp is not None
        channels = 1
        if negotiated.codec_name == "opus" and negotiated.opus is not None and negotiated.opus.stereo:
            channels = 2
        config = MediaCallConfig(
            call_id=leg.id,
            codec=negotiated.codec_name,  # type: ignore[arg-type]
            payload_type=negotiated.payload_type,
            remote_rtp=negotiated.remote_rtp,
            remote_rtcp=negotiated.remote_rtcp,
            ssrc=random.getrandbits(32),
            initial_sequence=random.getrandbits(16),
            initial_timestamp=random.getrandbits(32),
            telephone_event_pt=negotiated.telephone_event_payload_type,
            channels=channels,
            direction=negotiated.direction,
            latch_any_source=not self.settings.rtp_strict_source,
        )
        now = self.clock_now()
        self.engine.add_call(config, now=now)
        leg.media_added = True
        engine = self.engine
        call_id = leg.id
        loop = asyncio.get_running_loop()
        leg.rtp.start(
            lambda data, addr: engine.packet_received(call_id, data, addr, loop.time()),
            lambda data, addr: engine.rtcp_received(call_id, data, addr, loop.time()),
        )

    def _established(self, leg: CallLeg, event: CallEstablished) -> None:
        if leg.negotiated is not None or not event.body:
            return
        try:  # a late offer: the ACK carries the caller's answer to our offer
            answer = parse_sdp(event.body)
            leg.negotiated = negotiate(answer, local=LocalMedia(), preferences=self.settings.codecs)
            leg.remote_sdp = answer
            self._start_media(leg)
        except (SdpError, NoCommonCodec, LocalMediaError) as exc:
            log.info("call %s: unusable SDP answer in ACK: %s", leg.id, exc)
            self.hang_up_leg(leg, "bad_sdp")

    def _reinvite(self, leg: CallLeg, event: ReinviteReceived) -> None:
        assert leg.sip is not None
        now = self.sip.now()
        if leg.rtp is None:
            self.endpoint.reject_reinvite(leg.sip, now, status=488)
            return
        public = self.settings.advertised_host or leg.rtp.host
        leg.session_version += 1
        session_id = leg.local_sdp.origin.session_id if leg.local_sdp is not None else random.getrandbits(31)
        if event.body is None or not event.body:
            offer = build_offer(
                local_address=public,
                local_port=leg.rtp.port,
                session_id=session_id,
                session_version=leg.session_version,
                preferences=self.settings.codecs,
            )
            self.endpoint.answer_reinvite(leg.sip, now, body=offer.to_bytes())
            return
        try:
            offer = parse_sdp(event.body)
            negotiated = negotiate(offer, local=LocalMedia(), preferences=self.settings.codecs)
        except (SdpError, NoCommonCodec) as exc:
            log.info("call %s: re-INVITE refused: %s", leg.id, exc)
            self.endpoint.reject_reinvite(leg.sip, now, status=488)
            return
        if leg.negotiated is not None and negotiated.codec_name != leg.negotiated.codec_name:
            # Changing codec mid-call would need new media state; keep it simple and refuse.
            self.endpoint.reject_reinvite(leg.sip, now, status=488, reason="codec change not supported")
            return
        if leg.media_added:
            self.engine.set_direction(leg.id, negotiated.direction)
            if not negotiated.on_hold:
                self.engine.update_remote(leg.id, negotiated.remote_rtp, negotiated.remote_rtcp)
        leg.negotiated = negotiated
        leg.remote_sdp = offer
        leg.local_sdp = build_answer(
            offer,
            negotiated,
            local_address=public,
            local_port=leg.rtp.port,
            session_id=session_id,
            session_version=leg.session_version,
        )
        self.endpoint.answer_reinvite(leg.sip, now, body=leg.local_sdp.to_bytes())

    # ------------------------------------------------------------------------------------ sessions

    def _make_session(self, leg: CallLeg) -> CallSession:
        """The call's session, created before the 200 OK so no caller frame arrives without one to hold it."""
        profile_model = leg.profile or _DEFAULT_PROFILE
        profile = profile_model.to_agent_profile()
        config = self.session_config
        webhooks = tuple(
            WebhookToolConfig(
                name=tool.name,
                url=tool.webhook.url,
                description=tool.description,
                parameters=tool.parameters,
                timeout_s=tool.webhook.timeout_s,
                auth_header=("Authorization", tool.webhook.auth_header) if tool.webhook.auth_header else None,
            )
            for tool in profile_model.tools
            if tool.webhook is not None
        )
        if webhooks:
            config = replace(config, webhook_tools=config.webhook_tools + webhooks)
        model = self._model(profile.provider)
        leg.provider = model.name
        session = CallSession(
            call_id=leg.id,
            profile=profile,
            model=model,
            control=SipCallControl(self, leg),
            config=config,
        )
        leg.session = session
        return session

    async def _run_session(self, leg: CallLeg) -> None:
        session = leg.session if leg.session is not None else self._make_session(leg)
        try:
            await session.start()
        except Exception as exc:
            log.warning("call %s: session failed to start: %s", leg.id, exc)
            leg.end_reason = leg.end_reason or "provider_unavailable"
            self.hang_up_leg(leg, leg.end_reason)
            return
        reason = await session.wait_ended()
        if leg.live and leg.sip is not None:
            self.hang_up_leg(leg, leg.end_reason or reason or "agent_ended")

    # ------------------------------------------------------------------------------------ ending

    def hang_up_leg(self, leg: CallLeg, reason: str) -> None:
        """End a call from our side (BYE / CANCEL / 480 as the state requires). Idempotent."""
        if not leg.end_reason:
            leg.end_reason = reason
        if leg.sip is not None:
            with contextlib.suppress(Exception):
                self.endpoint.hang_up(leg.sip, self.sip.now(), reason=reason)
            self.sip.pump()
        self._begin_finish(leg, reason)

    def _begin_finish(self, leg: CallLeg, reason: str) -> None:
        if not leg.end_reason:
            leg.end_reason = reason
        if leg.state in ("ending", "ended"):
            return
        leg.state = "ending"
        if leg.task is None or leg.task.done():
            leg.task = self._spawn(self._finish(leg, reason), name=f"call-{leg.id}-finish")
        elif leg.task is asyncio.current_task():
            return  # the call's own task finishes the call on its way out
        elif leg.session is not None:
            # the call's own task is waiting on its session: closing the session wakes it
            self._spawn(leg.session.aclose(leg.end_reason), name=f"call-{leg.id}-close")
        else:
            leg.task.cancel()

    async def _finish(self, leg: CallLeg, reason: str) -> None:
        if leg.state == "ended":
            return
        if not leg.end_reason:
            leg.end_reason = reason
        leg.state = "ending"
        if leg.session is not None:
            try:
                await leg.session.aclose(leg.end_reason)
            except Exception:
                log.exception("call %s: session close failed", leg.id)
        if leg.sip is not None:
            with contextlib.suppress(Exception):
                self.endpoint.hang_up(leg.sip, self.sip.now(), reason=leg.end_reason)
            self.sip.pump()
        was_active = leg.answered_wall is not None
        self._release_media(leg)
        leg.state = "ended"
        leg.ended_wall = time.time()
        if leg.transfer is not None and not leg.transfer.done():
            leg.transfer.cancel()
        if leg.answered is not None and not leg.answered.done():
            leg.answered.set_result(False)
        if was_active:
            ACTIVE_CALLS.labels(self._metric_worker).dec()
        CALLS_TOTAL.labels(self._metric_worker, leg.end_reason).inc()
        log.info("call %s ended: %s", leg.id, leg.end_reason)
        if leg.route:  # refused before admission: the control plane holds nothing for it, so say nothing
            with contextlib.suppress(Exception):
                await self._report("call.ended", leg)
        self.legs.pop(leg.id, None)
        if leg.sip is not None:
            self._by_handle.pop(leg.sip, None)
        if self.draining and self._exit_when_empty and not any(lg.live for lg in self.legs.values()):
            self.exited.set()

    def _release_media(self, leg: CallLeg) -> None:
        if leg.media_added:
            leg.last_media = self.engine.stats(leg.id, self.clock_now())  # the ended call keeps its figures
            leg.media_added = False
            bye = self.engine.remove_call(leg.id)
            if leg.rtp is not None:
                for _, destination, data in bye:
                    leg.rtp.send_rtcp(data, destination)
        if leg.rtp is not None:
            self._rtp_in_done += leg.rtp.stats.received
            self._rtp_out_done += leg.rtp.stats.sent
            self.ports.release(leg.rtp)
            leg.rtp = None
        self.counters.forget_call(leg.id)

    # ------------------------------------------------------------------------------------ the tick

    def clock_now(self) -> float:
        return asyncio.get_running_loop().time()

    def _on_tick(self, deadline: float) -> None:
        engine = self.engine
        if not len(engine):
            return
        now = deadline
        self._tick_no += 1
        inbound = engine.tick_inbound(now)
        legs = self.legs
        sample_level = self._tick_no % LEVEL_EVERY_TICKS == 0
        outbound = {}
        for call_id, frame in inbound.frames.items():
            leg = legs.get(call_id)
            session = leg.session if leg is not None else None
            if session is None:
                outbound[call_id] = None
                continue
            session.push_inbound(frame)
            outbound[call_id] = session.pull_outbound()
            if sample_level:
                level = dbfs(frame.pcm)
                leg.last_level = max(level, -100.0)  # type: ignore[union-attr]
                leg.levels.append(leg.last_level)  # type: ignore[union-attr]
        for dtmf in inbound.events:
            leg = legs.get(dtmf.call_id)
            if leg is not None and leg.session is not None:
                leg.session.dtmf_received(dtmf.digit)
        for call_id, destination, data in engine.tick_outbound(outbound, now):
            leg = legs.get(call_id)
            if leg is not None and leg.rtp is not None:
                leg.rtp.send_rtp(data, destination)
        for call_id, destination, data in engine.rtcp_due(now):
            leg = legs.get(call_id)
            if leg is not None and leg.rtp is not None:
                leg.rtp.send_rtcp(data, destination)
        if self._tick_no % _RTP_CHECK_EVERY_TICKS == 0:
            self._check_inactivity(now)

    def _check_inactivity(self, now: float) -> None:
        timeout = self.settings.rtp_timeout_s
        for leg in list(self.legs.values()):
            if not leg.media_added or leg.state != "active" or leg.negotiated is None:
                continue
            if leg.negotiated.on_hold or leg.negotiated.direction in ("sendonly", "inactive"):
                continue
            if self.engine.inactive_for(leg.id, now) > timeout:
                log.info("call %s: no RTP for %.0f s", leg.id, timeout)
                self.hang_up_leg(leg, "rtp_timeout")

    def _on_tick_measured(self, lag: float, duration: float, overrun: bool) -> None:
        TICK_SECONDS.labels(self._metric_worker).observe(duration)
        LOOP_LAG_SECONDS.labels(self._metric_worker).observe(max(lag, 0.0))
        if overrun:
            TICK_OVERRUNS_TOTAL.labels(self._metric_worker).inc()

    # ------------------------------------------------------------------------------------ commands

    def send_dtmf_leg(self, leg: CallLeg, digits: str) -> None:
        if not leg.media_added:
            raise LocalMediaError("the call has no media yet")
        self.engine.send_dtmf(leg.id, digits)

    def refer_leg(self, leg: CallLeg, target: str) -> None:
        assert leg.sip is not None
        uri = target
        if not target.startswith(("sip:", "sips:", "tel:")):
            host = leg.source.rsplit(":", 1)[0] if leg.source else self.settings.sip_host
            uri = f"sip:{target}@{host}"
        self.endpoint.refer(leg.sip, self.sip.now(), target_uri=uri)
        self.sip.pump()

    def _leg(self, call_id: str) -> CallLeg:
        leg = self.legs.get(call_id)
        if leg is None or not leg.live:
            from gateway.fleet.errors import CallNotFoundError

            raise CallNotFoundError(call_id)
        return leg

    async def hang_up(self, call_id: str, reason: str) -> None:
        if self.webrtc.owns(call_id):  # browser call
            return await self.webrtc.hang_up(call_id, reason)
        self.hang_up_leg(self._leg(call_id), reason)

    async def transfer(self, call_id: str, target: str) -> None:
        if self.webrtc.owns(call_id):  # browser call
            return await self.webrtc.transfer(call_id, target)
        leg = self._leg(call_id)
        control = SipCallControl(self, leg)
        self._spawn(self._transfer_and_end(leg, control, target), name=f"call-{leg.id}-transfer")

    async def _transfer_and_end(self, leg: CallLeg, control: SipCallControl, target: str) -> None:
        outcome = await control.transfer(target)
        log.info("call %s: transfer to %s %s", leg.id, target, outcome.status)
        if outcome.status == "accepted":
            self.hang_up_leg(leg, "transferred")

    async def send_dtmf(self, call_id: str, digits: str) -> None:
        if self.webrtc.owns(call_id):  # browser call
            return await self.webrtc.send_dtmf(call_id, digits)
        self.send_dtmf_leg(self._leg(call_id), digits)

    async def drain(self, exit_when_empty: bool) -> None:
        self.draining = True
        self.endpoint.set_accepting_calls(False)
        self._exit_when_empty = exit_when_empty
        if exit_when_empty and not any(leg.live for leg in self.legs.values()):
            self.exited.set()

    async def originate(self, request: OriginateRequest, admission: AdmissionDecision) -> str:
        """Place an outbound call to ``request.to`` with our offer; returns the call id at once."""
        from gateway.fleet.errors import CommandRejectedError

        if self.draining or self._closing:
            raise CommandRejectedError("worker is draining")
        to_uri = request.to
        if not to_uri.startswith(("sip:", "sips:", "tel:")):
            if self.settings.trunk is None:
                raise CommandRejectedError(
                    f"{request.to!r} is a number, not a SIP URI, and no trunk is configured (GATEWAY_TRUNK)"
                )
            to_uri = f"sip:{request.to}@{self.settings.trunk}"
        leg = CallLeg(
            id=admission.call_id or f"c-{secrets.token_hex(6)}",
            sip=None,
            direction="outbound",
            from_uri=request.caller_id,
            to_uri=request.to,
            route=admission.route,
            profile=admission.profile or _DEFAULT_PROFILE,
        )
        rtp = self.ports.allocate()
        leg.rtp = rtp
        public = self.settings.advertised_host or rtp.host
        leg.local_sdp = build_offer(
            local_address=public,
            local_port=rtp.port,
            session_id=random.getrandbits(31),
            session_version=1,
            preferences=self.settings.codecs,
        )
        caller = request.caller_id or "gateway"
        from_uri = caller if caller.startswith("sip:") else f"sip:{caller}@{self.settings.public_host}"
        leg.from_uri, leg.to_uri = from_uri, to_uri
        leg.answered = asyncio.get_running_loop().create_future()
        leg.sip = self.endpoint.invite(
            to_uri,
            self.sip.now(),
            from_uri=from_uri,
            body=leg.local_sdp.to_bytes(),
            credentials=self._trunk_credentials,
        )
        self.legs[leg.id] = leg
        self._by_handle[leg.sip] = leg
        leg.state = "ringing"
        self.sip.pump()
        leg.task = self._spawn(self._run_outbound(leg, request.ring_timeout_s), name=f"call-{leg.id}")
        return leg.id

    def _outbound_answered(self, leg: CallLeg, event: OutboundCallAnswered) -> None:
        try:
            answer = parse_sdp(event.body)
            leg.negotiated = negotiate(answer, local=LocalMedia(), preferences=self.settings.codecs)
            leg.remote_sdp = answer
            self._start_media(leg)
        except (SdpError, NoCommonCodec, LocalMediaError) as exc:
            log.info("call %s: unusable SDP answer: %s", leg.id, exc)
            if leg.answered is not None and not leg.answered.done():
                leg.answered.set_result(False)
            self.hang_up_leg(leg, "bad_sdp")
            return
        if leg.answered is not None and not leg.answered.done():
            leg.answered.set_result(True)

    async def _run_outbound(self, leg: CallLeg, ring_timeout_s: float) -> None:
        try:
            await self._report("call.started", leg)
            assert leg.answered is not None
            try:
                answered = await asyncio.wait_for(asyncio.shield(leg.answered), timeout=ring_timeout_s)
            except TimeoutError:
                self.hang_up_leg(leg, "no_answer")
                return
            if not answered or not leg.live:
                return
            leg.state = "active"
            leg.answered_wall = time.time()
            ACTIVE_CALLS.labels(self._metric_worker).inc()
            await self._report("call.updated", leg)
            await self._run_session(leg)
        finally:
            await self._finish(leg, leg.end_reason or "ended")

    # ------------------------------------------------------------------------------------ reporting

    def _codec(self, leg: CallLeg) -> str:
        return leg.negotiated.codec_name if leg.negotiated is not None else ""

    def snapshot_of(self, leg: CallLeg) -> CallSnapshot:
        media = self.engine.stats(leg.id, self.clock_now()) if leg.media_added else leg.last_media
        stats: dict[str, object] = {}
        if media is not None:
            stats = media_fields(
                packets_in=media.received,
                packets_out=media.packets_sent,
                lost=media.lost,
                loss_pct=100.0 * media.loss_fraction,
                jitter_ms=media.jitter_ms,
                late=media.late,
                rtt_ms=media.rtt_ms,
                # jitter buffer + one tick each way + packetization
                delay_ms=media.target_delay_ms + 40.0,
                codec=media.codec,
            )
        stats.update(level_fields(leg.last_level, leg.levels))
        return build_snapshot(
            call_id=leg.id,
            kind="sip",
            direction=leg.direction,
            from_=user_part(leg.from_uri),
            to=user_part(leg.to_uri),
            route=leg.route,
            provider=leg.provider or (leg.profile.provider if leg.profile is not None else ""),
            state=leg.state,
            worker=self.id,
            codec=self._codec(leg),
            started=leg.started_wall,
            answered=leg.answered_wall,
            ended=leg.ended_wall,
            end_reason=leg.end_reason,
            stats=stats,
            session=leg.session,
        )

    async def snapshot(self) -> list[CallSnapshot]:
        return [self.snapshot_of(leg) for leg in list(self.legs.values())] + await self.webrtc.snapshot()  # + browser

    async def _report(self, kind: str, leg: CallLeg) -> None:
        if self.link is None:
            return
        try:
            await self.link.report(
                [WorkerEvent(type=kind, worker=self.id, time=time.time(), call=self.snapshot_of(leg))]
            )  # type: ignore[arg-type]
        except Exception as exc:
            log.warning("report %s for %s failed: %s", kind, leg.id, exc)
