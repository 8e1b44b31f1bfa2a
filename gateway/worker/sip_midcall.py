"""Mid-call offer/answer of the SIP legs: the peer's re-INVITE or UPDATE (hold, resume, rekey, a new address, a
refresh), the answer an ACK carries after a re-INVITE without an offer, and our own hold re-INVITEs (the ops API's
``/hold`` and ``/unhold``, the agent's ``hold_caller`` tool): RFC 3264 §8 through :class:`OfferAnswer`.

A hold, whoever placed it, moves the leg ACTIVE <-> HELD, tells the session (gateway/session/hold.py: the agent's
playout pauses, the provider is told) and reports ``call.held`` / ``call.resumed`` to the control plane.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gateway.fleet.errors import CommandRejectedError
from gateway.fleet.models import WorkerEventType
from gateway.media.srtp import SrtpConfig
from gateway.media.tick import TickEngine
from gateway.session.hold import HoldBy
from gateway.sip.events import ReinviteAcked, ReinviteAnswered, ReinviteFailed, ReinviteReceived
from gateway.sip.offer_answer import Answered, OfferAnswerState, Refused
from gateway.sip.sdes import SrtpNegotiated
from gateway.worker.legs import LegState, move
from gateway.worker.ports import SipSignalling
from gateway.worker.sip_leg import CallLeg
from gateway.worker.slices import CapacitySettings

log = logging.getLogger(__name__)


def srtp_config(srtp: SrtpNegotiated | None) -> SrtpConfig | None:
    if srtp is None:
        return None
    return SrtpConfig(
        suite=srtp.suite, local_key=srtp.local_key, remote_key=srtp.remote_key, replay_window=srtp.replay_window or 0
    )


class MidCall:
    """Mid-call offer/answer of every SIP leg, with the ports it uses: signalling, the tick engine, what a codec
    costs, and ``report`` (a leg's call.held / call.resumed to the control plane, sent in the background)."""

    def __init__(
        self,
        *,
        signalling: SipSignalling,
        engine: TickEngine,
        costs: CapacitySettings,
        report: Callable[[WorkerEventType, CallLeg], None],
    ) -> None:
        self._signalling = signalling
        self._engine = engine
        self._costs = costs
        self._report = report

    def reinvite_received(self, leg: CallLeg, event: ReinviteReceived) -> None:
        """A re-INVITE or UPDATE: hold, resume, rekey, a new address or a refresh; or, without a body, our
        re-offer. A refused re-offer leaves the call as it was."""
        assert leg.sip is not None
        sdp = leg.sdp
        taking = (OfferAnswerState.NEGOTIATED, OfferAnswerState.REOFFERED)
        if leg.rtp is None or sdp is None or sdp.state not in taking:
            self._signalling.reject_reinvite(leg.sip, 488)
            return
        if not event.body:
            self._signalling.answer_reinvite(leg.sip, sdp.offer().to_bytes())
            return
        result = sdp.update(event.body)
        if isinstance(result, Refused):
            log.info("call %s: re-INVITE refused: %s", leg.id, result.reason)
            self._signalling.reject_reinvite(leg.sip, result.status, result.reason)
            return
        self._media_changed(leg, result)
        assert sdp.local is not None
        self._signalling.answer_reinvite(leg.sip, sdp.local.to_bytes())

    def _media_changed(self, leg: CallLeg, result: Answered) -> None:
        """A new offer/answer of the peer's (or its answer to the re-offer our 2xx made): direction, address,
        keys and cost follow it, and the call goes on or off the caller's hold."""
        negotiated = result.media
        if leg.media_added:
            self._engine.set_direction(leg.id, negotiated.direction)
            if not negotiated.on_hold:
                self._engine.update_remote(leg.id, negotiated.remote_rtp, negotiated.remote_rtcp)
            config = srtp_config(result.srtp)
            if config is not None and result.rekeyed:  # RFC 4568 §7.1.4: the changed side rekeys
                self._engine.set_srtp(leg.id, config)
        leg.cost = leg.agent_cost + self._costs.call_cost(negotiated.codec_name, srtp=result.srtp is not None)
        self._hold_state(leg, held=negotiated.on_hold or negotiated.direction in ("sendonly", "inactive"))

    def reinvite_acked(self, leg: CallLeg, event: ReinviteAcked) -> None:
        """The ACK carried the answer to the offer our 2xx made to a re-INVITE without one."""
        sdp = leg.sdp
        if sdp is None or sdp.state is not OfferAnswerState.REOFFERED:
            return
        result = sdp.take_answer(event.body)
        if isinstance(result, Refused):
            log.info("call %s: the ACK's answer is unusable: %s", leg.id, result.reason)
            return
        self._media_changed(leg, result)

    def _hold_state(self, leg: CallLeg, *, held: bool, by: HoldBy = "caller") -> None:
        """ACTIVE <-> HELD as the far end puts the call on hold (RFC 3264 §8.4) or takes it off, or we do: the
        session pauses or continues the agent's playout (gateway/session/hold.py) and the control plane is told."""
        if leg.session is not None and leg.session.held not in (None, by):
            return  # held by the other side: its own resume ends the hold
        if held and leg.state is LegState.ACTIVE:
            move(leg, LegState.HELD)
        elif not held and leg.state is LegState.HELD:
            move(leg, LegState.ACTIVE)
        else:
            return
        if leg.session is not None:
            leg.session.set_held(held, by=by)
        self._report("call.held" if held else "call.resumed", leg)

    def media_moved(self, leg: CallLeg) -> None:
        """The call moved to a new dialog (a transfer by the peer's REFER): a hold of the old one is over."""
        leg.hold_pending = None
        self._hold_state(leg, held=False, by="caller")
        self._hold_state(leg, held=False, by="gateway")

    def start_hold(self, leg: CallLeg, held: bool) -> None:
        """The ops API's hold: our re-INVITE with a=sendonly (or a=sendrecv to resume); the session pauses and
        plays the hold audio once the phone has answered it (:meth:`reinvite_answered`)."""
        sdp, session = leg.sdp, leg.session
        if leg.sip is None or sdp is None or session is None or not leg.media_added:
            raise CommandRejectedError("the call is not answered yet")
        if leg.hold_pending is not None or sdp.state is not OfferAnswerState.NEGOTIATED:
            raise CommandRejectedError("an offer of this call awaits its answer; try again")
        if held and session.held is not None:
            raise CommandRejectedError(f"the call is on hold already (by the {session.held})")
        if not held and session.held != "gateway":
            raise CommandRejectedError("the gateway does not hold this call")
        if leg.state not in (LegState.ACTIVE, LegState.HELD):
            raise CommandRejectedError(f"the call is {leg.state.value}")
        leg.hold_pending = held
        self._signalling.reinvite(leg.sip, sdp.offer(direction="sendonly" if held else "sendrecv").to_bytes())

    def reinvite_answered(self, leg: CallLeg, event: ReinviteAnswered) -> None:
        pending, leg.hold_pending = leg.hold_pending, None
        sdp = leg.sdp
        if sdp is None or sdp.state is not OfferAnswerState.REOFFERED:
            return
        result = sdp.take_answer(event.body)
        if isinstance(result, Refused):
            log.info("call %s: the answer to our re-INVITE is unusable: %s", leg.id, result.reason)
            return
        if leg.media_added:
            self._engine.set_direction(leg.id, result.media.direction)
        if pending is not None:
            self._hold_state(leg, held=pending, by="gateway")
        if result.media.on_hold:  # the phone holds the call itself meanwhile: its own unhold ends that
            self._hold_state(leg, held=True, by="caller")

    def reinvite_failed(self, leg: CallLeg, event: ReinviteFailed) -> None:
        leg.hold_pending = None
        if leg.sdp is not None and leg.sdp.state is OfferAnswerState.REOFFERED:
            leg.sdp.offer_refused()
        log.info("call %s: our re-INVITE was refused: %d %s", leg.id, event.status, event.reason)
