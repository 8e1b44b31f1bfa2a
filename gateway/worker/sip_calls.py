"""SIP calls of a media worker, from INVITE to the last RTCP BYE.

Inbound: ``CallOffered`` -> admission by the control plane (route -> agent profile) -> SDP offer/answer ->
an RTP port pair -> media state in the tick engine -> a CallSession (created before the 200 OK, so it holds
caller frames while it connects) -> 200 OK. Outbound (``originate``): INVITE with our offer, through the
trunk for bare numbers -> media and session on the 2xx. Mid-call: re-INVITE/UPDATE (hold, unhold, refresh),
INFO DTMF, REFER with NOTIFY tracking for the transfer tool. Every way a call can end — either side hangs
up, the session ends it, RTP stops, the ops API asks, the worker shuts down — meets in :meth:`SipCalls._finish`,
which is idempotent and releases everything the call held.
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
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, final

from gateway.compiled import caused
from gateway.fleet.models import (
    AdmissionDecision,
    AdmissionRequest,
    CallSnapshot,
    OriginateRequest,
    WorkerEvent,
    WorkerEventType,
)
from gateway.media.call import MediaCallConfig
from gateway.media.errors import LocalMediaError
from gateway.media.srtp import SrtpConfig
from gateway.observability import (
    ACTIVE_CALLS,
    CALL_SETUP_SECONDS,
    CALLS_TOTAL,
    SIP_CALLS_TOTAL,
)
from gateway.providers.base import RealtimeModel
from gateway.session.config import WebhookToolConfig
from gateway.session.session import CallSession
from gateway.sip.errors import LocalProtocolError, RemoteProtocolError
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
from gateway.sip.headers import reason_value
from gateway.sip.offer_answer import MediaPolicy, OfferAnswer, OfferAnswerState, Refused
from gateway.sip.sdes import SrtpNegotiated
from gateway.transport.errors import PortsExhaustedError
from gateway.transport.rtp_socket import RtpEndpoint
from gateway.worker.counters import call_figures, latency_observer
from gateway.worker.legs import CallLeg, SipCallControl
from gateway.worker.reporting import build_snapshot, level_fields, media_fields, user_part

log = logging.getLogger(__name__)

ModelFactory = Callable[[str], RealtimeModel]
_RTP_CHECK_EVERY_TICKS = 50  # inactivity and RTCP bookkeeping once a second


if TYPE_CHECKING:
    from gateway.worker.settings import MediaSettings
    from gateway.worker.worker import MediaWorker


@final
class TickRoute:
    """Where the tick hands one SIP call's frames and packets: its session and RTP sockets, read once per call
    and direction every tick. :class:`CallLeg` is not compiled (its controls hold it weakly, ADR 0006), so each
    of its attributes costs the compiled tick a dictionary lookup; these are fields of a compiled class.

    Made when the call's media starts, with the leg's RTP sockets (which stay the leg's until its media is
    released, when the route goes); the session joins it when it is made, which may be later."""

    __slots__ = ("leg", "level_phase", "rtp", "session")

    def __init__(self, leg: CallLeg, rtp: RtpEndpoint) -> None:
        self.leg = leg
        self.rtp = rtp
        self.session: CallSession | None = leg.session
        self.level_phase = leg.level_phase


def _offer_answer(settings: MediaSettings) -> OfferAnswer:
    """A call's offer/answer (gateway/sip/offer_answer.py) under the worker's media policy; our SRTP keys come
    from ``os.urandom`` (the sans-I/O core takes them injected)."""
    policy = MediaPolicy(codecs=settings.codecs, srtp=settings.srtp, suites=settings.srtp_suites)
    return OfferAnswer(policy, session_id=random.getrandbits(31), key_source=os.urandom)


def _srtp_config(srtp: SrtpNegotiated | None) -> SrtpConfig | None:
    if srtp is None:
        return None
    return SrtpConfig(
        suite=srtp.suite, local_key=srtp.local_key, remote_key=srtp.remote_key, replay_window=srtp.replay_window or 0
    )


class SipCalls:
    """The SIP legs of one :class:`~gateway.worker.worker.MediaWorker` (which owns the shared machinery)."""

    def __init__(self, worker: MediaWorker) -> None:
        self._worker = worker
        self.by_handle: dict[CallHandle, CallLeg] = {}
        # RTP packets counted on the sockets of calls that have ended (live ones are summed at each export)
        self.rtp_in_done = 0
        self.rtp_out_done = 0

    def on_sip_events(self, events: list[SipEvent]) -> None:
        for event in events:
            if isinstance(event, CallOffered):
                self._offered(event)
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
                # A transport error (the INVITE never got out: resolve, connect, tls) ends it as e.g. tls_failed.
                leg.end_reason = f"{event.transport_error}_failed" if event.transport_error else f"sip_{event.status}"
                if event.transport_error:
                    log.warning("call %s to %s failed: %s", leg.id, leg.to_uri, event.reason)
                if leg.answered is not None and not leg.answered.done():
                    leg.answered.set_result(False)
                self._begin_finish(leg, leg.end_reason)

    def _offered(self, event: CallOffered) -> None:
        leg = CallLeg(
            id=f"c-{secrets.token_hex(6)}",
            sip=event.call,
            direction="inbound",
            from_uri=event.from_uri,
            to_uri=event.to_uri,
            source=f"{event.source[0]}:{event.source[1]}",
            transport=event.transport,
        )
        SIP_CALLS_TOTAL.labels(self._worker.id, event.transport, "inbound").inc()
        self._worker.legs[leg.id] = leg
        self.by_handle[event.call] = leg
        leg.task = self._worker.spawn(self._run_inbound(leg, event), name=f"call-{leg.id}")

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
            self._worker.endpoint.reject(leg.sip, self._worker.sip.now(), status=status, reason=reason, headers=headers)
        self._worker.sip.pump()

    async def _admit(self, leg: CallLeg, *, called: str, caller: str) -> AdmissionDecision:
        if self._worker.draining or self._worker.closing:
            return AdmissionDecision(
                accepted=False, status=503, code="draining", reason="worker draining", retry_after_s=5
            )
        if self._worker.over_capacity():
            return AdmissionDecision(
                accepted=False, status=503, code="over_capacity", reason="worker full", retry_after_s=5
            )
        if self._worker.link is None:
            return AdmissionDecision(
                accepted=True,
                call_id=leg.id,
                worker=self._worker.id,
                route="default",
                profile=self._worker.default_profile,
            )
        request = AdmissionRequest(
            called=called,
            caller=caller,
            source=leg.source,
            kind="sip",
            direction=leg.direction,
            worker=self._worker.id,
            call_id=leg.id,
            cost=leg.cost,
        )
        try:
            return await self._worker.link.admit(request)
        except Exception as exc:
            log.warning("admission for %s failed: %s", leg.id, exc)
            return AdmissionDecision(
                accepted=False, status=503, code="no_control", reason="control plane unreachable", retry_after_s=5
            )

    async def _run_inbound(self, leg: CallLeg, event: CallOffered) -> None:
        try:
            # The offer first: its codec is what the call takes of the worker's capacity, and an offer the
            # worker cannot take is answered 488 without holding an admission slot.
            if not self._negotiate_offer(leg, event.body):
                return
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
            leg.profile = decision.profile or self._worker.default_profile
            if not self._prepare_media(leg):
                return
            assert leg.sip is not None and leg.sdp is not None and leg.sdp.local is not None
            self._make_session(leg)  # holds caller frames from the first one on, while it connects
            self._worker.endpoint.answer(leg.sip, self._worker.sip.now(), body=leg.sdp.local.to_bytes())
            self._worker.sip.pump()
            leg.state = "active"
            leg.answered_wall = time.time()
            CALL_SETUP_SECONDS.labels(self._worker.id).observe(time.monotonic() - leg.started_mono)
            ACTIVE_CALLS.labels(self._worker.id).inc()
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

    def _negotiate_offer(self, leg: CallLeg, offer_body: bytes) -> bool:
        """Pick the codec of the INVITE's offer and set what the call takes of the capacity; False when it was
        refused (488, the reason naming the problem). An INVITE without an offer takes what the dearest codec of
        ours costs (the caller picks from our offer in its ACK)."""
        settings = self._worker.settings
        leg.sdp = _offer_answer(settings.media)
        if not offer_body:
            leg.cost = settings.offer_cost()
            return True
        result = leg.sdp.answer(offer_body)
        if isinstance(result, Refused):
            self._reject(leg, result.status, result.reason, end_reason=result.code)
            self._begin_finish(leg, result.code)
            log.info("call %s: offer refused: %s", leg.id, result.reason)
            return False
        leg.cost = settings.costs.call_cost(result.media.codec_name, srtp=result.srtp is not None)
        return True

    def _prepare_media(self, leg: CallLeg) -> bool:
        """Open RTP and answer the negotiated offer (or make our offer for a late-offer INVITE)."""
        try:
            rtp = self._worker.ports.allocate()
        except PortsExhaustedError:
            self._reject(leg, 503, "no media ports", end_reason="no_media_ports", retry_after=5)
            self._begin_finish(leg, "no_media_ports")
            return False
        leg.rtp = rtp
        assert leg.sdp is not None
        leg.sdp.bind(address=self._worker.settings.sip.advertised_host or rtp.host, port=rtp.port)
        if leg.sdp.media is None:
            leg.sdp.offer()
            return True  # media starts when the ACK brings the answer
        self._start_media(leg)
        return True

    def _start_media(self, leg: CallLeg) -> None:
        assert leg.sdp is not None and leg.rtp is not None
        negotiated, srtp = leg.sdp.media, leg.sdp.srtp
        assert negotiated is not None
        leg.cost = self._worker.settings.costs.call_cost(negotiated.codec_name, srtp=srtp is not None)
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
            latch_any_source=not self._worker.settings.media.rtp_strict_source,
            jitter=self._worker.settings.media.jitter_config,
            srtp=_srtp_config(srtp),
        )
        now = self._worker.clock_now()
        self._worker.engine.add_call(config, now=now)
        leg.media_added = True
        self._worker.routes[leg.id] = TickRoute(leg, leg.rtp)
        engine = self._worker.engine
        call_id = leg.id
        loop = asyncio.get_running_loop()
        on_rtcp = lambda data, addr: engine.rtcp_received(call_id, data, addr, loop.time())  # noqa: E731
        drain = self._worker.rtp_drain
        if drain is not None:  # read by the tick, with the kernel's arrival times (ADR 0007)
            leg.rtp.start_drained(drain, functools.partial(engine.packet_received, call_id), on_rtcp)
        else:
            leg.rtp.start(lambda data, addr: engine.packet_received(call_id, data, addr, loop.time()), on_rtcp)

    def _established(self, leg: CallLeg, event: CallEstablished) -> None:
        if leg.sdp is None or leg.sdp.state is not OfferAnswerState.OFFERED or not event.body:
            return
        if not self._take_answer(leg, event.body):  # a late offer: the ACK carries the caller's answer to ours
            self.hang_up_leg(leg, "bad_sdp")

    def _reinvite(self, leg: CallLeg, event: ReinviteReceived) -> None:
        """A re-INVITE or UPDATE: hold, resume, rekey, a new address or a refresh; or, without a body, our
        re-offer. A refused re-offer leaves the call as it was."""
        assert leg.sip is not None
        now = self._worker.sip.now()
        sdp = leg.sdp
        if leg.rtp is None or sdp is None or sdp.state not in (OfferAnswerState.NEGOTIATED, OfferAnswerState.REOFFERED):
            self._worker.endpoint.reject_reinvite(leg.sip, now, status=488)
            return
        if not event.body:
            self._worker.endpoint.answer_reinvite(leg.sip, now, body=sdp.offer().to_bytes())
            return
        result = sdp.update(event.body)
        if isinstance(result, Refused):
            log.info("call %s: re-INVITE refused: %s", leg.id, result.reason)
            self._worker.endpoint.reject_reinvite(leg.sip, now, status=result.status, reason=result.reason)
            return
        negotiated = result.media
        if leg.media_added:
            self._worker.engine.set_direction(leg.id, negotiated.direction)
            if not negotiated.on_hold:
                self._worker.engine.update_remote(leg.id, negotiated.remote_rtp, negotiated.remote_rtcp)
            config = _srtp_config(result.srtp)
            if config is not None and result.rekeyed:  # RFC 4568 §7.1.4: the changed side rekeys
                self._worker.engine.set_srtp(leg.id, config)
        leg.cost = self._worker.settings.costs.call_cost(negotiated.codec_name, srtp=result.srtp is not None)
        assert sdp.local is not None
        self._worker.endpoint.answer_reinvite(leg.sip, now, body=sdp.local.to_bytes())

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
        profile_model = leg.profile or self._worker.default_profile
        profile = replace(profile_model.to_agent_profile(), call_context=_call_context(leg))
        config = self._worker.session_config
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
        model = self._worker.model_for(profile.provider)
        leg.provider = model.name
        session = CallSession(
            call_id=leg.id,
            profile=profile,
            model=model,
            control=SipCallControl(self, leg),
            config=config,
            on_latency=latency_observer(self._worker.id, model.name),
        )
        leg.session = session
        route = self._worker.routes.get(leg.id)
        if route is not None:  # media started before the session was made
            route.session = session
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

    def hang_up_leg(self, leg: CallLeg, reason: str) -> None:
        """End a call from our side (BYE / CANCEL / 480 as the state requires). Idempotent."""
        if not leg.end_reason:
            leg.end_reason = reason
        if leg.sip is not None:
            with contextlib.suppress(Exception):
                # RFC 3326: the BYE says why we end the call, for the far end's logs.
                self._worker.endpoint.hang_up(
                    leg.sip, self._worker.sip.now(), reason=reason, headers=(("Reason", reason_value(reason)),)
                )
            self._worker.sip.pump()
        self._begin_finish(leg, reason)

    def _begin_finish(self, leg: CallLeg, reason: str) -> None:
        if not leg.end_reason:
            leg.end_reason = reason
        if leg.state in ("ending", "ended"):
            return
        leg.state = "ending"
        if leg.task is None or leg.task.done():
            leg.task = self._worker.spawn(self._finish(leg, reason), name=f"call-{leg.id}-finish")
        elif leg.task is asyncio.current_task():
            return  # the call's own task finishes the call on its way out
        elif leg.session is not None:
            # the call's own task is waiting on its session: closing the session wakes it
            self._worker.spawn(leg.session.aclose(leg.end_reason), name=f"call-{leg.id}-close")
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
                self._worker.endpoint.hang_up(leg.sip, self._worker.sip.now(), reason=leg.end_reason)
            self._worker.sip.pump()
        was_active = leg.answered_wall is not None
        self.release_media(leg)
        leg.state = "ended"
        leg.ended_wall = time.time()
        if leg.transfer is not None and not leg.transfer.done():
            leg.transfer.cancel()
        if leg.answered is not None and not leg.answered.done():
            leg.answered.set_result(False)
        if was_active:
            ACTIVE_CALLS.labels(self._worker.id).dec()
        CALLS_TOTAL.labels(self._worker.id, leg.end_reason).inc()
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
            with contextlib.suppress(Exception):
                await self._report("call.ended", leg)
        self._worker.legs.pop(leg.id, None)
        if leg.sip is not None:
            self.by_handle.pop(leg.sip, None)
        self._worker.drainer.check_empty()

    def release_media(self, leg: CallLeg) -> None:
        """The leg's media and RTP ports go back; its last figures are kept on the leg and counted."""
        figures = None
        if leg.media_added:
            # the ended call keeps its figures
            media = leg.last_media = self._worker.engine.stats(leg.id, self._worker.clock_now())
            gaps = leg.session.agent_audio_gaps if leg.session is not None else 0
            figures = call_figures(leg.id, media, agent_audio_gaps=gaps)
            leg.media_added = False
            self._worker.routes.pop(leg.id, None)
            bye = self._worker.engine.remove_call(leg.id)
            if leg.rtp is not None:
                for _, destination, data in bye:
                    leg.rtp.send_rtcp(data, destination)
        if leg.rtp is not None:
            self.rtp_in_done += leg.rtp.stats.received
            self.rtp_out_done += leg.rtp.stats.sent
            self._worker.ports.release(leg.rtp)
            leg.rtp = None
        self._worker.counters.call_ended(leg.id, figures)

    def send_dtmf_leg(self, leg: CallLeg, digits: str) -> None:
        if not leg.media_added:
            raise LocalMediaError("the call has no media yet")
        self._worker.engine.send_dtmf(leg.id, digits)

    def refer_leg(self, leg: CallLeg, target: str) -> None:
        assert leg.sip is not None
        uri = target
        if not target.startswith(("sip:", "sips:", "tel:")):
            host = leg.source.rsplit(":", 1)[0] if leg.source else self._worker.settings.sip.sip_host
            uri = f"sip:{target}@{host}"
        self._worker.endpoint.refer(leg.sip, self._worker.sip.now(), target_uri=uri)
        self._worker.sip.pump()

    async def transfer_and_end(self, leg: CallLeg, control: SipCallControl, target: str) -> None:
        """Blind transfer (REFER); the call ends here once the far end accepted it."""
        outcome = await control.transfer(target)
        log.info("call %s: transfer to %s %s", leg.id, target, outcome.status)
        if outcome.status == "accepted":
            self.hang_up_leg(leg, "transferred")

    def _outbound_answered(self, leg: CallLeg, event: OutboundCallAnswered) -> None:
        if not self._take_answer(leg, event.body):
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
            ACTIVE_CALLS.labels(self._worker.id).inc()
            await self._report("call.updated", leg)
            await self._run_session(leg)
        finally:
            await self._finish(leg, leg.end_reason or "ended")

    def _codec(self, leg: CallLeg) -> str:
        negotiated = leg.negotiated
        return negotiated.codec_name if negotiated is not None else ""

    @staticmethod
    def _srtp(leg: CallLeg) -> SrtpNegotiated | None:
        return leg.sdp.srtp if leg.sdp is not None else None

    def snapshot_of(self, leg: CallLeg) -> CallSnapshot:
        media = self._worker.engine.stats(leg.id, self._worker.clock_now()) if leg.media_added else leg.last_media
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
        return build_snapshot(
            call_id=leg.id,
            kind="sip",
            direction=leg.direction,
            from_=user_part(leg.from_uri),
            to=user_part(leg.to_uri),
            route=leg.route,
            provider=leg.provider or (leg.profile.provider if leg.profile is not None else ""),
            state=leg.state,
            worker=self._worker.id,
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
        )

    async def _report(self, kind: WorkerEventType, leg: CallLeg) -> None:
        if self._worker.link is None:
            return
        try:
            await self._worker.link.report(
                [WorkerEvent(type=kind, worker=self._worker.id, time=time.time(), call=self.snapshot_of(leg))]
            )
        except Exception as exc:
            log.warning("report %s for %s failed: %s", kind, leg.id, exc)

    async def originate(self, request: OriginateRequest, admission: AdmissionDecision) -> str:
        """Place an outbound call to ``request.to`` with our offer; returns the call id at once."""
        from gateway.fleet.errors import CommandRejectedError

        if self._worker.draining or self._worker.closing:
            raise CommandRejectedError("worker is draining")
        to_uri = request.to
        if not to_uri.startswith(("sip:", "sips:", "tel:")):
            if self._worker.settings.trunking.trunk is None:
                raise CommandRejectedError(
                    f"{request.to!r} is a number, not a SIP URI, and no trunk is configured (GATEWAY_TRUNK)"
                )
            to_uri = f"sip:{request.to}@{self._worker.settings.trunking.trunk}"
        leg = CallLeg(
            id=admission.call_id or f"c-{secrets.token_hex(6)}",
            sip=None,
            direction="outbound",
            from_uri=request.caller_id,
            to_uri=request.to,
            route=admission.route,
            profile=admission.profile or self._worker.default_profile,
            cost=self._worker.settings.offer_cost(),  # until the answer names the codec
        )
        rtp = self._worker.ports.allocate()
        leg.rtp = rtp
        leg.sdp = _offer_answer(self._worker.settings.media)
        leg.sdp.bind(address=self._worker.settings.sip.advertised_host or rtp.host, port=rtp.port)
        offer = leg.sdp.offer()
        caller = request.caller_id or "gateway"
        from_uri = caller if caller.startswith("sip:") else f"sip:{caller}@{self._worker.settings.sip.public_host}"
        leg.from_uri, leg.to_uri = from_uri, to_uri
        leg.answered = asyncio.get_running_loop().create_future()
        try:
            leg.sip = self._worker.endpoint.invite(
                to_uri,
                self._worker.sip.now(),
                from_uri=from_uri,
                body=offer.to_bytes(),
                credentials=self._worker.trunk_credentials,
            )
        except LocalProtocolError as exc:  # a bad URI, or sips: without TLS enabled here
            self._worker.ports.release(rtp)
            leg.rtp = None
            raise caused(CommandRejectedError(str(exc)), exc)  # noqa: B904
        leg.transport = self._worker.endpoint.transport_of(leg.sip) or ""
        SIP_CALLS_TOTAL.labels(self._worker.id, leg.transport, "outbound").inc()
        self._worker.legs[leg.id] = leg
        self.by_handle[leg.sip] = leg
        leg.state = "ringing"
        self._worker.sip.pump()
        leg.task = self._worker.spawn(self._run_outbound(leg, request.ring_timeout_s), name=f"call-{leg.id}")
        return leg.id


def _call_context(leg: CallLeg) -> dict[str, str]:
    """What a provider may tell its peer about the call (the websocket provider's customParameters)."""
    return {
        "from_number": user_part(leg.from_uri),
        "to_number": user_part(leg.to_uri),
        "call_id": leg.id,
        "direction": leg.direction,
        "route": leg.route,
        "transport": "sip",
    }
