"""SIP calls of a media worker, from INVITE to the last RTCP BYE.

Inbound: ``CallOffered`` -> admission by the control plane (route -> agent profile) -> SDP offer/answer ->
an RTP port pair -> media state in the tick engine -> a CallSession (created before the 200 OK, so it holds
caller frames while it connects) -> 200 OK. Outbound (``originate``): INVITE with our offer, through the
trunk for bare numbers -> media and session on the 2xx. Mid-call: re-INVITE/UPDATE (hold, unhold, refresh),
INFO DTMF, REFER with NOTIFY tracking for the transfer tool. Every way a call can end — either side hangs
up, the session ends it, RTP stops, the ops API asks, the worker shuts down — goes through :meth:`SipCalls.end`
(the state table and the one goodbye on the wire: gateway/worker/legs.py) and :meth:`SipCalls._finish`, which
releases everything the call held.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import secrets
import time
from collections.abc import Coroutine
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from gateway.compiled import caused
from gateway.fleet.models import (
    AdmissionDecision,
    AdmissionRequest,
    CallSnapshot,
    EarlyMediaModel,
    InviteFacts,
    OriginateRequest,
    ProfileModel,
    TransferLine,
    WarmTransferRequest,
    WorkerEvent,
    WorkerEventType,
)
from gateway.media.call import MediaCallConfig
from gateway.media.errors import LocalMediaError
from gateway.media.inband import InbandDtmf
from gateway.observability import (
    ACTIVE_CALLS,
    CALL_SETUP_SECONDS,
    CALLS_TOTAL,
    SIP_CALLS_TOTAL,
    TRUNK_CALLS_TOTAL,
)
from gateway.session.amd_gate import AmdPolicy
from gateway.session.config import WebhookToolConfig
from gateway.session.control import TransferOutcome
from gateway.session.session import CallSession
from gateway.session.state import CallState as SessionState
from gateway.session.transcript import DtmfMethod
from gateway.sip.caller_context import CallContext, context_from_invite, render
from gateway.sip.errors import LocalProtocolError
from gateway.sip.events import (
    AuthenticationFailed,
    CallCancelled,
    CallEnded,
    CallEstablished,
    CallHandle,
    CallOffered,
    DtmfInfoReceived,
    OutboundCallAnswered,
    OutboundCallFailed,
    OutboundCallProgressed,
    ReinviteAcked,
    ReinviteAnswered,
    ReinviteFailed,
    ReinviteReceived,
    SipEvent,
    SourceBlocked,
    TransferFailed,
    TransferProgressed,
)
from gateway.sip.headers import reason_value
from gateway.sip.offer_answer import Answered, MediaPolicy, OfferAnswer, OfferAnswerState, Refused
from gateway.sip.replaces import offers_replaces
from gateway.sip.sdes import SrtpNegotiated
from gateway.tracing import CallTrace, traceparent_of
from gateway.transport.errors import PortsExhaustedError
from gateway.worker.counters import call_figures, latency_observer
from gateway.worker.early_media import outbound_answered, outbound_progressed, play_inbound
from gateway.worker.edge import EdgeReporter
from gateway.worker.handoffs import HandoffEvent, ProfileHandoffs, handoff_report
from gateway.worker.legs import SNAPSHOT_STATE, LegRegistry, LegState, begin_end, move
from gateway.worker.ports import CallHost, MediaPlant, SipSignalling
from gateway.worker.recorder import load_notice
from gateway.worker.referred import Referrals
from gateway.worker.reporting import build_snapshot, level_fields, media_fields, user_part
from gateway.worker.routes import TickRoute
from gateway.worker.sip_leg import CallLeg, SipCallControl
from gateway.worker.sip_midcall import MidCall, srtp_config
from gateway.worker.slices import WarmTransferSettings
from gateway.worker.trunk_config import Dial, InboundTrunks, Trunk, dial, trunk_media
from gateway.worker.warm import WarmTransfers

log = logging.getLogger(__name__)

# An admission still undecided after this (the route's call-time application is asked, or a far control plane is
# slow) rings the caller, so that a caller never waits in silence.
RING_AFTER_S = 0.1


if TYPE_CHECKING:
    from gateway.sip.auth import ClientCredentials
    from gateway.transport.rtp_socket import RtpEndpoint
    from gateway.worker.bridge import Bridge
    from gateway.worker.settings import CapacitySettings, MediaSettings, SipListenSettings, TrunkSettings


def _offer_answer(settings: MediaSettings) -> OfferAnswer:
    """A call's offer/answer (gateway/sip/offer_answer.py) under the worker's media policy; our SRTP keys come
    from ``os.urandom`` (the sans-I/O core takes them injected)."""
    policy = MediaPolicy(
        codecs=settings.codecs,
        srtp=settings.srtp,
        suites=settings.srtp_suites,
        telephone_event=settings.telephone_event,
    )
    return OfferAnswer(policy, session_id=random.getrandbits(31), key_source=os.urandom)


class SipCalls:
    """The SIP legs of one worker, built with the ports they use: the call host (tasks, models, admission, the
    control-plane link), SIP signalling, the media plant, the registry of legs and their settings' slices."""

    def __init__(
        self,
        host: CallHost,
        signalling: SipSignalling,
        plant: MediaPlant,
        legs: LegRegistry,
        *,
        sip: SipListenSettings,
        media: MediaSettings,
        costs: CapacitySettings,
        trunk: TrunkSettings,
        trunks: dict[str, Trunk] | None = None,
        trunk_credentials: ClientCredentials | None = None,
        warm: WarmTransferSettings | None = None,
    ) -> None:
        self._host = host
        self._signalling = signalling
        self._plant = plant
        self._legs = legs
        self._sip_settings = sip
        self._media_settings = media
        self._costs = costs
        self._trunk_settings = trunk
        self._trunk_credentials = trunk_credentials
        self._trunks = trunks or {}
        self._inbound_trunks = InboundTrunks(self._trunks)
        self.closing = False  # the worker is shutting down: no new calls
        self.by_handle: dict[CallHandle, CallLeg] = {}
        self.midcall = MidCall(signalling=signalling, engine=plant.engine, costs=costs, report=self._report_later)
        self.referrals = Referrals(self, host=host, signalling=signalling, plant=plant)
        # RTP packets counted on the sockets of calls that have ended (live ones are summed at each export)
        self.rtp_in_done = 0
        self.rtp_out_done = 0
        self._edge = EdgeReporter(host)
        self.warm = WarmTransfers(self, warm or WarmTransferSettings(), worker_id=host.id)

    def on_sip_events(self, events: list[SipEvent]) -> None:
        for event in events:
            if self.referrals.claims(event):  # a peer's REFER, and the calls it placed (gateway/worker/referred.py)
                continue
            if isinstance(event, CallOffered):
                self._offered(event)
                continue
            if isinstance(event, AuthenticationFailed | SourceBlocked):
                self._edge.observed(event)
                continue
            leg = self.by_handle.get(event.call) if hasattr(event, "call") else None  # type: ignore[arg-type]
            if leg is None:
                continue
            if isinstance(event, CallEstablished):
                self._established(leg, event)
            elif isinstance(event, CallEnded):
                reason = "caller_hangup" if event.by == "remote" else (leg.end_reason or event.reason)
                if event.status is not None and event.by == "remote":
                    reason = f"sip_{event.status}"
                self.end(leg, reason)
            elif isinstance(event, CallCancelled):
                self.end(leg, "caller_cancelled")
            elif isinstance(event, DtmfInfoReceived):
                if (bridge := leg.bridge) is not None and bridge.joined:
                    self.bridged_dtmf(bridge, leg.id, event.digit)
                elif leg.session is not None:
                    leg.session.dtmf_received(event.digit, duration_ms=event.duration_ms)
            elif isinstance(event, ReinviteReceived):
                self.midcall.reinvite_received(leg, event)
            elif isinstance(event, ReinviteAnswered):
                self.midcall.reinvite_answered(leg, event)
            elif isinstance(event, ReinviteAcked):
                self.midcall.reinvite_acked(leg, event)
            elif isinstance(event, ReinviteFailed):
                self.midcall.reinvite_failed(leg, event)
            elif isinstance(event, TransferProgressed):
                leg.transfer_seen_progress = True
                if event.final and leg.referral is not None and not leg.referral.done():
                    leg.referral.set_result(TransferOutcome(status="accepted", sip_status=event.status))
            elif isinstance(event, TransferFailed):
                if leg.referral is not None and not leg.referral.done():
                    status = "failed" if leg.transfer_seen_progress else "refused"
                    leg.referral.set_result(
                        TransferOutcome(status=status, sip_status=event.status, detail=event.reason)  # type: ignore[arg-type]
                    )
            elif isinstance(event, OutboundCallProgressed):
                if outbound_progressed(
                    leg, event, worker=self._host.id, start_media=functools.partial(self._early_start, leg)
                ):
                    self._make_session(leg)  # not started: it records the early media; AMD starts at the 200
            elif isinstance(event, OutboundCallAnswered):
                self._outbound_answered(leg, event)
            elif isinstance(event, OutboundCallFailed):
                # A transport error (the INVITE never got out: resolve, connect, tls) ends it as e.g. tls_failed.
                leg.end_reason = f"{event.transport_error}_failed" if event.transport_error else f"sip_{event.status}"
                if event.transport_error:
                    log.warning("call %s to %s failed: %s", leg.id, leg.to_uri, event.reason)
                if leg.answered is not None and not leg.answered.done():
                    leg.answered.set_result(False)
                self.end(leg, leg.end_reason)

    def _offered(self, event: CallOffered) -> None:
        leg = CallLeg(
            id=f"c-{secrets.token_hex(6)}",
            sip=event.call,
            direction="inbound",
            from_uri=event.from_uri,
            to_uri=event.to_uri,
            source=f"{event.source[0]}:{event.source[1]}",
            transport=event.transport,
            owner=self,
            refer_replaces=offers_replaces(event.headers),
        )
        SIP_CALLS_TOTAL.labels(self._host.id, event.transport, "inbound").inc()
        leg.trace = _call_trace(leg)
        leg.trace.start("setup", "call.setup")
        self._legs.add(leg)
        self.by_handle[event.call] = leg
        with leg.trace.active():  # the call's task (and the session's, made in it) log under its trace
            leg.task = self._host.spawn(self._run_inbound(leg, event), name=f"call-{leg.id}")

    def _reject(
        self,
        leg: CallLeg,
        status: int,
        reason: str,
        *,
        end_reason: str,
        retry_after: int | None = None,
        contact: str = "",
    ) -> None:
        # Set before the answer goes out: the endpoint reports CallEnded at once, and its reason phrase
        # (free text, e.g. naming the dialled number) must not become the end reason or a metric label.
        if not leg.end_reason:
            leg.end_reason = end_reason
        if leg.sip is None:
            return
        headers: tuple[tuple[str, str], ...] = (("Retry-After", str(retry_after)),) if retry_after else ()
        if contact:  # a redirect (3xx): where the caller goes
            headers += (("Contact", f"<{contact}>"),)
        with contextlib.suppress(LocalProtocolError):  # no longer offered: cancelled meanwhile (answered 487)
            self._signalling.reject(leg.sip, status, reason, headers=headers)

    async def _admit(
        self, leg: CallLeg, *, called: str, caller: str, invite: InviteFacts | None = None
    ) -> AdmissionDecision:
        if self._host.draining or self.closing:
            return AdmissionDecision(
                accepted=False, status=503, code="draining", reason="worker draining", retry_after_s=5
            )
        if self._host.over_capacity():
            return AdmissionDecision(
                accepted=False, status=503, code="over_capacity", reason="worker full", retry_after_s=5
            )
        if self._host.link is None:
            return AdmissionDecision(
                accepted=True,
                call_id=leg.id,
                worker=self._host.id,
                route="default",
                profile=self._host.default_profile,
            )
        request = AdmissionRequest(
            called=called,
            caller=caller,
            source=leg.source,
            kind="sip",
            direction=leg.direction,
            worker=self._host.id,
            call_id=leg.id,
            cost=leg.cost,
            invite=invite,
            traceparent=traceparent_of(leg.trace.start("admit", "call.admit", parent="setup"))
            if leg.trace is not None
            else "",
        )
        ringing = asyncio.get_running_loop().call_later(RING_AFTER_S, self._ring, leg)
        try:
            return await self._host.link.admit(request)
        except Exception as exc:
            log.warning("admission for %s failed: %s", leg.id, exc)
            return AdmissionDecision(
                accepted=False, status=503, code="no_control", reason="control plane unreachable", retry_after_s=5
            )
        finally:
            ringing.cancel()

    def _ring(self, leg: CallLeg) -> None:
        if leg.sip is not None and leg.state is LegState.ADMITTED:
            with contextlib.suppress(LocalProtocolError):
                self._signalling.ring(leg.sip)

    async def _run_inbound(self, leg: CallLeg, event: CallOffered) -> None:
        try:
            # The offer first: its codec is what the call takes of the worker's capacity, and an offer the
            # worker cannot take is answered 488 without holding an admission slot.
            if not self._negotiate_offer(leg, event.body):
                return
            decision = await self._admit(
                leg, called=user_part(event.to_uri), caller=user_part(event.from_uri), invite=InviteFacts.of(event)
            )
            if leg.trace is not None:
                leg.trace.end("admit", {"gateway.admission.accepted": decision.accepted}, error=decision.code)
            if leg.state is not LegState.ADMITTED:  # cancelled or hung up while the control plane decided
                return
            if not decision.accepted:
                # The control plane's refusals, or the SIP status the route's call-time application chose.
                status = decision.status if 300 <= decision.status <= 699 else 503
                rejected = f"rejected_{decision.code or status}"
                self._reject(
                    leg,
                    status,
                    decision.reason or "not admitted",
                    end_reason=rejected,
                    retry_after=decision.retry_after_s,
                    contact=decision.contact,
                )
                self.end(leg, rejected)
                return
            leg.route = decision.route
            leg.refer_policy = decision.refer
            leg.trunk = decision.trunk
            leg.profile = decision.profile or self._host.default_profile
            leg.context = _inbound_context(leg, event, leg.profile)
            if decision.metadata:  # the call-time application's
                leg.context = replace(leg.context, metadata=tuple(decision.metadata.items()))
            if not self._prepare_media(leg):
                return
            assert leg.sip is not None and leg.sdp is not None and leg.sdp.local is not None
            self._make_session(leg)  # holds caller frames from the first one on, while it connects
            if decision.early_media is not None and not await self._early_media(leg, decision.early_media):
                return
            self._signalling.answer(leg.sip, leg.sdp.local.to_bytes())
            move(leg, LegState.ACTIVE)
            leg.answered_wall = time.time()
            if leg.trace is not None:
                leg.trace.end("setup", {"gateway.route": leg.route, "gateway.codec": self._codec(leg)})
            CALL_SETUP_SECONDS.labels(self._host.id).observe(time.monotonic() - leg.started_mono)
            ACTIVE_CALLS.labels(self._host.id).inc()
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
            self.end(leg, "internal_error")
        finally:
            await self._finish(leg, leg.end_reason or "ended")

    async def _early_media(self, leg: CallLeg, plan: EarlyMediaModel) -> bool:
        """183 and the route's early media before the 200 OK (gateway/worker/early_media.py); False: it ended."""
        sip, session = leg.sip, leg.session
        assert sip is not None and session is not None
        return await play_inbound(
            leg,
            plan,
            route=self._plant.routes.get(leg.id),
            worker=self._host.id,
            ring=lambda body: self._signalling.ring(sip, status=183, body=body),
            start_session=session.start,
            end=lambda reason: self.end(leg, reason),
            load_file=load_notice,
        )

    def _negotiate_offer(self, leg: CallLeg, offer_body: bytes) -> bool:
        """Pick the codec of the INVITE's offer and set what the call takes of the capacity; False when it was
        refused (488, the reason naming the problem). An INVITE without an offer takes what the dearest codec of
        ours costs (the caller picks from our offer in its ACK)."""
        trunk = self._inbound_trunks.of(leg.source.rpartition(":")[0].strip("[]"))
        media = trunk_media(self._media_settings, trunk)
        if trunk is not None:
            leg.via_trunk = trunk.name
            log.info("call %s: from the trunk %s", leg.id, trunk.name)
            TRUNK_CALLS_TOTAL.labels(self._host.id, trunk.name, "inbound").inc()
        leg.sdp = _offer_answer(media)
        if not offer_body:
            leg.cost = leg.agent_cost + self._costs.offer_cost(media)
            return True
        result = leg.sdp.answer(offer_body)
        if isinstance(result, Refused):
            self._reject(leg, result.status, result.reason, end_reason=result.code)
            self.end(leg, result.code)
            log.info("call %s: offer refused: %s", leg.id, result.reason)
            return False
        leg.cost = leg.agent_cost + self._costs.call_cost(result.media.codec_name, srtp=result.srtp is not None)
        return True

    def _prepare_media(self, leg: CallLeg) -> bool:
        """Open RTP and answer the negotiated offer (or make our offer for a late-offer INVITE)."""
        try:
            rtp = self._plant.ports.allocate()
        except PortsExhaustedError:
            self._reject(leg, 503, "no media ports", end_reason="no_media_ports", retry_after=5)
            self.end(leg, "no_media_ports")
            return False
        leg.rtp = rtp
        assert leg.sdp is not None
        leg.sdp.bind(address=self._sip_settings.advertised_host or rtp.host, port=rtp.port)
        if leg.sdp.media is None:
            leg.sdp.offer()
            return True  # media starts when the ACK brings the answer
        self._start_media(leg)
        return True

    def _start_media(self, leg: CallLeg) -> None:
        assert leg.sdp is not None and leg.rtp is not None
        negotiated, srtp = leg.sdp.media, leg.sdp.srtp
        assert negotiated is not None
        leg.cost = leg.agent_cost + self._costs.call_cost(negotiated.codec_name, srtp=srtp is not None)
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
            latch_any_source=not self._media_settings.rtp_strict_source,
            jitter=self._media_settings.jitter_config,
            srtp=srtp_config(srtp),
        )
        now = self._plant.now()
        self._plant.engine.add_call(config, now=now)
        leg.media_added = True
        inband = InbandDtmf(detect=True) if negotiated.telephone_event_payload_type is None else None
        self._plant.routes[leg.id] = TickRoute(leg, leg.rtp, inband)
        engine = self._plant.engine
        call_id = leg.id
        loop = asyncio.get_running_loop()
        on_rtcp = lambda data, addr: engine.rtcp_received(call_id, data, addr, loop.time())  # noqa: E731
        drain = self._plant.rtp_drain
        if drain is not None:  # read by the tick, with the kernel's arrival times (ADR 0007)
            leg.rtp.start_drained(drain, functools.partial(engine.packet_received, call_id), on_rtcp)
        else:
            leg.rtp.start(lambda data, addr: engine.packet_received(call_id, data, addr, loop.time()), on_rtcp)

    def _established(self, leg: CallLeg, event: CallEstablished) -> None:
        if leg.sdp is None or leg.sdp.state is not OfferAnswerState.OFFERED or not event.body:
            return
        if not self._take_answer(leg, event.body):  # a late offer: the ACK carries the caller's answer to ours
            self.end(leg, "bad_sdp")

    def _take_answer(self, leg: CallLeg, body: bytes) -> bool:
        """The remote's answer to our offer, then the call's media; False when it cannot be used."""
        assert leg.sdp is not None
        result = leg.sdp.take_answer(body)
        if isinstance(result, Refused):
            log.info("call %s: unusable SDP answer: %s", leg.id, result.reason)
            return False
        try:
            self._start_media(leg)
        except LocalMediaError as exc:
            log.info("call %s: the answer's media cannot start: %s", leg.id, exc)
            return False
        return True

    def _make_session(self, leg: CallLeg) -> CallSession:
        """The call's session, created before the 200 OK so no caller frame arrives without one to hold it."""
        profile_model = leg.profile or self._host.default_profile
        context = leg.context = leg.context or _outbound_context(leg)
        agent = profile_model.to_agent_profile()
        profile = replace(
            agent,
            instructions=render(agent.instructions, context),
            greeting=render(agent.greeting, context),
            call_context=context.as_parameters(),
        )
        config = self._host.session_config
        webhooks = tuple(
            WebhookToolConfig(
                name=tool.name,
                url=tool.webhook.url,
                description=tool.description,
                parameters=tool.parameters,
                timeout_s=tool.webhook.timeout_s,
                auth_header=("Authorization", tool.webhook.auth_header) if tool.webhook.auth_header else None,
                context=context.as_json(),
            )
            for tool in profile_model.tools
            if tool.webhook is not None
        )
        if webhooks:
            config = replace(config, webhook_tools=config.webhook_tools + webhooks)
        if profile_model.guardrails:
            config = replace(
                config,
                guardrails=profile_model.guardrail_configs(),
                guardrail_every_chars=profile_model.guardrail_every_chars,
            )
        model = self._host.model_for(profile.provider)
        leg.provider = model.name
        leg.agent_cost = self._costs.agent_cost(model, profile)
        leg.cost += leg.agent_cost
        session = CallSession(
            call_id=leg.id,
            profile=profile,
            model=model,
            control=SipCallControl(leg),
            config=config,
            on_latency=latency_observer(self._host.id, model.name),
            handoffs=ProfileHandoffs(profile_model.handoff_profiles, context=context, model_for=self._host.model_for),
            on_handoff=functools.partial(self._handoff_reported, leg),
            trace=leg.trace,
            on_guardrail_tripped=lambda _event: self._host.spawn(
                self._report("guardrail.tripped", leg), name=f"call-{leg.id}-report"
            ),
            amd=leg.amd,
            on_amd=None if leg.amd is None else lambda _report: self._report_later("call.amd_detected", leg),
            amd_recognisers=self._host.amd_recognisers,
        )
        leg.session = session
        route = self._plant.routes.get(leg.id)
        if route is not None:  # media started before the session was made
            route.session = session
        recordings = self._plant.recordings
        if recordings is not None and (recorder := recordings.open(leg.id, profile_model)) is not None:
            leg.recording = recorder.info
        return session

    async def _run_session(self, leg: CallLeg) -> None:
        session = leg.session if leg.session is not None else self._make_session(leg)
        try:
            if session.state is SessionState.CONNECTING:  # not started yet by a greeting's early media
                await session.start()
        except Exception as exc:
            log.warning("call %s: session failed to start: %s", leg.id, exc)
            leg.end_reason = leg.end_reason or "provider_unavailable"
            self.end(leg, leg.end_reason)
            return
        reason = await session.wait_ended()
        if leg.warm is not None and leg.bridge is not None:  # bridged to a human: lives on without its agent
            await leg.warm.bridged_until_over(leg.id)
            reason = "peer_hangup"
        if leg.live and leg.sip is not None:
            self.end(leg, leg.end_reason or reason or "agent_ended")

    def end(self, leg: CallLeg, reason: str) -> None:
        """The one way a SIP call ends, whoever ends it (either side, the session, the ops API, a drain, RTP
        silence, a shutdown). The first reason is the one recorded and the state moves to ENDING once; the
        goodbye on the wire (BYE, CANCEL or 480 as the dialog's state requires, nothing when the far end ended
        it) is sent here and nowhere else; then the call's task is woken to finish it (:meth:`_finish`)."""
        if not begin_end(leg, reason):
            return
        if leg.warm is not None:
            leg.warm.leg_ended(leg.id)  # a warm transfer's leg: the transfer (and a bridged peer) is told
        if leg.sip is not None:
            # RFC 3326: the BYE says why we end the call, for the far end's logs.
            self._signalling.hang_up(leg.sip, leg.end_reason, headers=(("Reason", reason_value(leg.end_reason)),))
        if leg.answered is not None and not leg.answered.done():
            leg.answered.set_result(False)  # an outbound call's task waits on the answer (its session, if made, too)
        task = leg.task
        if task is None or task.done():
            leg.task = self._host.spawn(self._finish(leg, leg.end_reason), name=f"call-{leg.id}-finish")
        elif task is asyncio.current_task():
            return  # the call's own task finishes the call on its way out
        elif leg.session is not None:
            # the call's own task is waiting on its session: closing the session wakes it
            self._host.spawn(leg.session.aclose(leg.end_reason), name=f"call-{leg.id}-close")
        else:
            task.cancel()

    async def _finish(self, leg: CallLeg, reason: str) -> None:
        """Release what the call held, once its task is done with it: session, media, ports, the record."""
        if leg.state is LegState.ENDED:
            return
        self.end(leg, reason)  # a task that ended the call by itself (cancelled at shutdown) says goodbye here
        self.referrals.leg_ended(leg)
        if leg.session is not None:
            try:
                await leg.session.aclose(leg.end_reason)
            except Exception:  # a session must not keep its call from being released
                log.exception("call %s: session close failed", leg.id)
        if leg.recording is not None and self._plant.recordings is not None:
            leg.recording = await self._plant.recordings.close(leg.id) or leg.recording
        was_active = leg.answered_wall is not None
        self.release_media(leg)
        move(leg, LegState.ENDED)
        leg.ended_wall = time.time()
        if leg.referral is not None and not leg.referral.done():
            leg.referral.cancel()
        if leg.answered is not None and not leg.answered.done():
            leg.answered.set_result(False)
        if was_active:
            ACTIVE_CALLS.labels(self._host.id).dec()
        CALLS_TOTAL.labels(self._host.id, leg.end_reason).inc()
        if leg.trace is not None:
            leg.trace.close(end_reason=leg.end_reason)
        media = leg.last_media
        if media is None:
            log.info("call %s ended: %s", leg.id, leg.end_reason)
        else:
            log.info(
                "call %s ended: %s; rtp received=%d lost=%d late=%d jitter_ms=%.1f playout concealed=%d "
                "underruns=%d discarded=%d inserted=%d resyncs=%d target_ms=%d",
                leg.id,
                leg.end_reason,
                media.received,
                media.lost,
                media.late,
                media.jitter_ms,
                media.concealed,
                media.underruns,
                media.discarded,
                media.inserted,
                media.resyncs,
                media.target_delay_ms,
            )
        if leg.route:  # refused before admission: the control plane holds nothing for it, so say nothing
            await self._report("call.ended", leg)
        self._legs.remove(leg)
        if leg.sip is not None:
            self.by_handle.pop(leg.sip, None)
        self._host.call_ended()

    def release_media(self, leg: CallLeg) -> None:
        """The leg's media and RTP ports go back; its last figures are kept on the leg and counted."""
        figures = None
        if leg.media_added:
            # the ended call keeps its figures
            media = leg.last_media = self._plant.engine.stats(leg.id, self._plant.now())
            gaps = leg.session.agent_audio_gaps if leg.session is not None else 0
            figures = call_figures(leg.id, media, agent_audio_gaps=gaps)
        self.detach_media(leg)
        self._host.counters.call_ended(leg.id, figures)

    def detach_media(self, leg: CallLeg) -> None:
        """The leg's media leaves the tick (an RTCP BYE to its peer) and its RTP ports go back, their packets
        counted: at the call's end, and when a REFER moves the call to a new leg (gateway/worker/referred.py)."""
        if leg.media_added:
            leg.media_added = False
            self._plant.routes.pop(leg.id, None)
            bye = self._plant.engine.remove_call(leg.id)
            if leg.rtp is not None:
                for _, destination, data in bye:
                    leg.rtp.send_rtcp(data, destination)
        if leg.rtp is not None:
            self.rtp_in_done += leg.rtp.stats.received
            self.rtp_out_done += leg.rtp.stats.sent
            self._plant.ports.release(leg.rtp)
            leg.rtp = None

    def send_dtmf_leg(self, leg: CallLeg, digits: str) -> None:
        if not leg.media_added:
            raise LocalMediaError("the call has no media yet")
        # RFC 4733 when the peer negotiated telephone-event, else SIP INFO when it allows INFO, else tones.
        route = self._plant.routes.get(leg.id)
        inband = route.inband if route is not None else None
        method: DtmfMethod = "rfc4733"
        if inband is None:
            self._plant.engine.send_dtmf(leg.id, digits)
        elif leg.sip is not None and self._signalling.peer_allows(leg.sip, "INFO"):
            try:
                for digit in digits:
                    self._signalling.send_dtmf_info(leg.sip, digit)
                method = "info"
            except LocalProtocolError:  # not confirmed yet (our 2xx awaits its ACK): tones need no dialog
                inband.queue(digits)
                method = "inband"
        else:
            inband.queue(digits)
            method = "inband"
        if leg.session is not None:
            leg.session.dtmf_sent(digits, method=method)

    def bridged_dtmf(self, bridge: Bridge, call_id: str, digit: str) -> None:
        """A digit from one leg of a joined warm-transfer bridge, sent to the other leg the way it takes digits
        (a human's IVR, a caller's PIN): the agent that would have taken it has left the call."""
        other = self._legs.get(bridge.other(call_id))
        if not isinstance(other, CallLeg) or not other.live:
            return  # the other leg is ending: the bridge ends with it
        try:
            self.send_dtmf_leg(other, digit)
        except (LocalMediaError, LocalProtocolError) as exc:
            log.warning("call %s: digit %r not sent on across the bridge to %s: %s", call_id, digit, other.id, exc)
            return
        bridge.digits += 1

    def refer_leg(self, leg: CallLeg, target: str) -> None:
        assert leg.sip is not None
        uri = target
        if not target.startswith(("sip:", "sips:", "tel:")):
            host = leg.source.rsplit(":", 1)[0] if leg.source else self._sip_settings.sip_host
            uri = f"sip:{target}@{host}"
        self._signalling.refer(leg.sip, uri)

    def start_hold(self, leg: CallLeg, held: bool) -> None:
        """The ops API's (or the agent's) hold: :meth:`MidCall.start_hold`."""
        self.midcall.start_hold(leg, held)

    def start_transfer(self, leg: CallLeg, target: str) -> None:
        """The ops API's blind transfer: runs in the background (:meth:`transfer_and_end`)."""
        self._host.spawn(self.transfer_and_end(leg, target), name=f"call-{leg.id}-transfer")

    async def transfer_and_end(self, leg: CallLeg, target: str) -> None:
        """Blind transfer (REFER); the call ends here once the far end accepted it."""
        outcome = await SipCallControl(leg).transfer(target)
        log.info("call %s: transfer to %s %s", leg.id, target, outcome.status)
        if outcome.status == "accepted":
            self.end(leg, "transferred")

    def _follow_answer(self, leg: CallLeg, result: Answered) -> None:
        """The 2xx of another fork than the early media's: its address, and its SRTP key."""
        media = result.media
        self._plant.engine.update_remote(leg.id, media.remote_rtp, media.remote_rtcp)
        config = srtp_config(result.srtp)
        if config is not None and result.rekeyed:
            self._plant.engine.set_srtp(leg.id, config)

    def _early_start(self, leg: CallLeg) -> TickRoute | None:
        self._start_media(leg)
        return self._plant.routes.get(leg.id)

    def _outbound_answered(self, leg: CallLeg, event: OutboundCallAnswered) -> None:
        kept = outbound_answered(
            leg,
            event,
            route=self._plant.routes.get(leg.id),
            worker=self._host.id,
            follow=functools.partial(self._follow_answer, leg),
        )
        if kept is None:
            kept = self._take_answer(leg, event.body)
        if not kept:
            if leg.answered is not None and not leg.answered.done():
                leg.answered.set_result(False)
            self.end(leg, "bad_sdp")
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
                self.end(leg, "no_answer")
                return
            if not answered or leg.state is not LegState.RINGING:
                return
            move(leg, LegState.ACTIVE)
            leg.answered_wall = time.time()
            if leg.trace is not None:
                leg.trace.end("setup", {"gateway.codec": self._codec(leg)})
            ACTIVE_CALLS.labels(self._host.id).inc()
            await self._report("call.updated", leg)
            await self._run_session(leg)
        finally:
            await self._finish(leg, leg.end_reason or "ended")

    async def start_warm_transfer(
        self, leg: CallLeg, request: WarmTransferRequest, *, initiator: Literal["agent", "api"]
    ) -> TransferLine:
        """A warm transfer of ``leg``'s caller to a human (gateway/worker/warm.py)."""
        return (await self.warm.start(leg, request, initiator=initiator)).line()

    # What a warm transfer needs of the calls (gateway/worker/warm.py, WarmHost).

    def sip_leg(self, call_id: str) -> CallLeg | None:
        leg = self._legs.get(call_id)
        return leg if isinstance(leg, CallLeg) else None

    async def refer_replacing(self, caller: CallLeg, human: CallLeg) -> TransferOutcome:
        """REFER the caller to the human, replacing the human's dialog with us (gateway/sip/replaces.py)."""
        try:
            target = self._signalling.replaces_target(human.sip) if human.sip is not None else None
        except LocalProtocolError as exc:
            target, why = None, str(exc)
        else:
            why = "the human's call has ended"
        if target is None:
            return TransferOutcome(status="refused", detail=why)
        return await SipCallControl(caller).transfer(target)

    def route_of(self, call_id: str) -> TickRoute | None:
        return self._plant.routes.get(call_id)

    def report_transfer(self, kind: WorkerEventType, leg: CallLeg, data: dict[str, Any]) -> None:
        self._host.spawn(self._report(kind, leg, data=data), name=f"call-{leg.id}-{kind}")

    def spawn_task(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return self._host.spawn(coro, name=name)

    def _codec(self, leg: CallLeg) -> str:
        negotiated = leg.negotiated
        return negotiated.codec_name if negotiated is not None else ""

    @staticmethod
    def _srtp(leg: CallLeg) -> SrtpNegotiated | None:
        return leg.sdp.srtp if leg.sdp is not None else None

    def snapshot_of(self, leg: CallLeg) -> CallSnapshot:
        media = self._plant.engine.stats(leg.id, self._plant.now()) if leg.media_added else leg.last_media
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
                concealed=media.concealed,
                underruns=media.underruns,
                discarded=media.discarded,
                inserted=media.inserted,
                # jitter buffer + one tick each way + packetization
                delay_ms=media.target_delay_ms + 40.0,
                codec=media.codec,
            )
        stats.update(level_fields(leg.last_level, leg.levels))
        early = leg.early
        heard, sent = (early.heard, early.sent) if early is not None else (leg.early_heard, leg.early_sent)
        if heard or sent:
            stats.update(early_media_frames_in=heard, early_media_frames_out=sent)
        snapshot = build_snapshot(
            call_id=leg.id,
            kind="sip",
            direction=leg.direction,
            from_=user_part(leg.from_uri),
            to=user_part(leg.to_uri),
            route=leg.route,
            provider=leg.provider or (leg.profile.provider if leg.profile is not None else ""),
            state=SNAPSHOT_STATE[leg.state],
            worker=self._host.id,
            codec=self._codec(leg),
            cost=leg.cost,
            started=leg.started_wall,
            answered=leg.answered_wall,
            ended=leg.ended_wall,
            end_reason=leg.end_reason,
            stats=stats,
            session=leg.session,
            srtp=srtp.suite if (srtp := self._srtp(leg)) is not None else "",
            transport=leg.transport,
            context=leg.context,
            trace_id=leg.trace.trace_id if leg.trace is not None else "",
            recording=leg.recording,
            amd=leg.session.amd if leg.session is not None else None,
            transfer=leg.warm.line() if leg.warm is not None else None,
            trunk=leg.via_trunk,
        )
        if leg.referrals:
            snapshot = snapshot.model_copy(update={"referrals": list(leg.referrals)})
        return snapshot

    def _report_later(self, kind: WorkerEventType, leg: CallLeg) -> None:
        self._host.spawn(self._report(kind, leg), name=f"call-{leg.id}-report")

    # --- what a transfer by the peer's REFER uses (gateway/worker/referred.py: ReferralOwner) ---

    def report_later(self, kind: WorkerEventType, leg: CallLeg, data: dict[str, Any]) -> None:
        self._host.spawn(self._report(kind, leg, data=data), name=f"call-{leg.id}-{kind}")

    def start_media(self, leg: CallLeg) -> None:
        self._start_media(leg)

    def new_offer_answer(self) -> OfferAnswer:
        return _offer_answer(self._media_settings)

    def media_address(self, rtp: RtpEndpoint) -> str:
        return self._sip_settings.advertised_host or rtp.host

    def media_moved(self, leg: CallLeg) -> None:
        self.midcall.media_moved(leg)

    def dial_target(self, leg: CallLeg, uri: str) -> Dial:
        """A tel: target goes through the call's route's trunk (else default), as a bare number does for originate
        (ValueError: none)."""
        if not uri.startswith("tel:"):
            return dial(self._trunks, uri, trunk_name=None, legacy_credentials=self._trunk_credentials)
        to = uri[4:].split(";")[0]
        return dial(self._trunks, to, trunk_name=leg.trunk, legacy_credentials=self._trunk_credentials)

    def _handoff_reported(self, leg: CallLeg, event: HandoffEvent) -> None:
        kind, data = handoff_report(event)
        self._host.spawn(self._report(kind, leg, data=data), name=f"call-{leg.id}-{kind}")

    async def _report(self, kind: WorkerEventType, leg: CallLeg, *, data: dict[str, Any] | None = None) -> None:
        if self._host.link is None:
            return
        try:
            snapshot = self.snapshot_of(leg)
            await self._host.link.report(
                [WorkerEvent(type=kind, worker=self._host.id, time=time.time(), call=snapshot, data=data or {})]
            )
        except Exception as exc:
            log.warning("report %s for %s failed: %s", kind, leg.id, exc)

    async def originate(self, request: OriginateRequest, admission: AdmissionDecision) -> str:
        """Place an outbound call to ``request.to`` with our offer; returns the call id at once."""
        from gateway.fleet.errors import CommandRejectedError

        if self._host.draining or self.closing:
            raise CommandRejectedError("worker is draining")
        try:
            route = dial(self._trunks, request.to, trunk_name=request.trunk, legacy_credentials=self._trunk_credentials)
        except ValueError as exc:
            raise caused(CommandRejectedError(str(exc)), None)  # noqa: B904
        to_uri = route.uri
        media = trunk_media(self._media_settings, route.trunk)
        leg = CallLeg(
            id=admission.call_id or f"c-{secrets.token_hex(6)}",
            sip=None,
            direction="outbound",
            from_uri=request.caller_id,
            to_uri=request.to,
            route=admission.route,
            refer_policy=admission.refer,
            trunk=route.trunk.name if route.trunk is not None else admission.trunk,
            via_trunk=route.trunk.name if route.trunk is not None else None,
            profile=admission.profile or self._host.default_profile,
            owner=self,
            cost=self._costs.offer_cost(media),  # until the answer names the codec
            amd=_amd_policy(request),
        )
        rtp = self._plant.ports.allocate()
        leg.rtp = rtp
        leg.sdp = _offer_answer(media)
        leg.sdp.bind(address=self._sip_settings.advertised_host or rtp.host, port=rtp.port)
        offer = leg.sdp.offer()
        caller = request.caller_id or "gateway"
        from_uri = caller if caller.startswith("sip:") else f"sip:{caller}@{self._sip_settings.public_host}"
        leg.from_uri, leg.to_uri = from_uri, to_uri
        leg.answered = asyncio.get_running_loop().create_future()
        try:
            leg.sip = self._signalling.invite(
                to_uri,
                from_uri=from_uri,
                body=offer.to_bytes(),
                credentials=route.credentials,
                outbound_proxy=route.outbound_proxy,
            )
        except LocalProtocolError as exc:  # a bad URI, or sips: without TLS enabled here
            self._plant.ports.release(rtp)
            leg.rtp = None
            raise caused(CommandRejectedError(str(exc)), exc)  # noqa: B904
        leg.transport = self._signalling.transport_of(leg.sip)
        SIP_CALLS_TOTAL.labels(self._host.id, leg.transport, "outbound").inc()
        if route.trunk is not None:
            TRUNK_CALLS_TOTAL.labels(self._host.id, route.trunk.name, "outbound").inc()
        leg.trace = _call_trace(leg, parent=admission.traceparent)
        leg.trace.start("setup", "call.setup")
        self._legs.add(leg)
        self.by_handle[leg.sip] = leg
        move(leg, LegState.RINGING)
        with leg.trace.active():
            leg.task = self._host.spawn(self._run_outbound(leg, request.ring_timeout_s), name=f"call-{leg.id}")
        return leg.id


def _amd_policy(request: OriginateRequest) -> AmdPolicy | None:
    if request.amd == "off":
        return None
    return AmdPolicy(mode=request.amd, voicemail_message=request.voicemail_message)


def _call_trace(leg: CallLeg, *, parent: str = "") -> CallTrace:
    """The call's root span on this worker (under the control plane's, for a call it originated)."""
    attributes = {"gateway.call.direction": leg.direction, "gateway.call.kind": "sip", "gateway.route": leg.route}
    return CallTrace(leg.id, "call", parent=parent, attributes=attributes)


def _inbound_context(leg: CallLeg, event: CallOffered, profile: ProfileModel) -> CallContext:
    """The caller's context from the INVITE, under the routes file's [context] policy."""
    context = context_from_invite(
        request_uri=event.request_uri,
        from_header=event.from_uri,
        from_display_name=event.from_display_name,
        to_uri=event.to_uri,
        headers=event.headers,
        source=event.source,
        transport=event.transport,
        policy=profile.context.to_policy(),
        call_id=leg.id,
        route=leg.route,
    )
    for problem in context.problems:
        log.info("call %s: caller context: %s", leg.id, problem)
    return context


def _outbound_context(leg: CallLeg) -> CallContext:
    """The context of a call the gateway placed: the numbers it was asked to use."""
    return CallContext(
        call_id=leg.id,
        direction=leg.direction,
        route=leg.route,
        transport=leg.transport,
        source=leg.source,
        caller_number=user_part(leg.from_uri),
        called_number=user_part(leg.to_uri),
    )
