"""A peer's REFER, on the worker: the gateway as the transferee (RFC 3515), the agent going with the call.

A carrier or a PBX that transfers one of our calls sends REFER with the target in Refer-To. The route's policy
(``refer`` / ``refer_allow`` in the routes file, carried to the worker in the admission decision) decides: declined
(603, the default), or accepted (202 and NOTIFY "100 Trying", by the sans-I/O core: gateway/sip/refer_sub.py).
An accepted REFER places a new call to the target (our offer on a new RTP port; the Replaces the Refer-To carried,
RFC 3891, and a Referred-By). Its answer moves the call onto the new leg: the old media stops, the new starts under
the same call id, and the session, its agent and recording go on with the transfer target. The referrer is
NOTIFYed of the new call's progress and result; the agent gets a system message saying the call was transferred
(and greets whoever answered); on success the referrer's dialog ends (it usually BYEs once it saw the 200;
if it does not within :data:`REFERRER_BYE_GRACE_S`, we do). On failure (busy, no answer, refused) the referrer
hears the status and the call goes on with the agent, unchanged.

Reports: ``call.refer_received`` (every REFER, with its outcome), then ``call.referred`` or ``call.refer_failed``;
the metric ``gateway_sip_refers_total{outcome}``; each REFER is a line of the call's ``referrals``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gateway.fleet.models import ReferralLine, WorkerEventType
from gateway.observability import SIP_REFERS_TOTAL
from gateway.session.errors import SessionStateError
from gateway.sip.errors import LocalProtocolError, RemoteProtocolError
from gateway.sip.events import (
    CallEnded,
    CallHandle,
    OutboundCallAnswered,
    OutboundCallFailed,
    OutboundCallProgressed,
    ReferReceived,
    SipEvent,
    TransferDeclined,
)
from gateway.sip.headers import reason_value
from gateway.sip.offer_answer import OfferAnswer, Refused
from gateway.sip.uri import parse_uri
from gateway.worker.legs import LegState

if TYPE_CHECKING:
    from gateway.transport.rtp_socket import RtpEndpoint
    from gateway.worker.ports import CallHost, MediaPlant, SipSignalling
    from gateway.worker.sip_leg import CallLeg
    from gateway.worker.trunk_config import Dial

log = logging.getLogger(__name__)
Outcome = Literal["declined", "referred", "failed"]

#: How long the transfer target may ring before the transfer fails (the referrer hears 487).
REFER_RING_TIMEOUT_S = 30.0
#: After the final 200 NOTIFY, how long the referrer has to BYE its dialog before we do.
REFERRER_BYE_GRACE_S = 4.0
#: What the agent is told once the call has moved (a system message; it then greets the new party).
TRANSFERRED_NOTE = (
    "The caller's phone system has transferred this call to {target}. You are now speaking with whoever answered "
    "there, who may not be the person you spoke with so far. Greet them briefly and carry on helping."
)


class ReferralOwner(Protocol):
    """What the SIP legs' owner (``SipCalls``) lends a transfer: its legs by dialog, their media, reports."""

    by_handle: dict[CallHandle, CallLeg]

    def start_media(self, leg: CallLeg) -> None: ...

    def detach_media(self, leg: CallLeg) -> None: ...

    def new_offer_answer(self) -> OfferAnswer: ...

    def media_address(self, rtp: RtpEndpoint) -> str:
        """The address our SDP gives for ``rtp``."""
        ...

    def end(self, leg: CallLeg, reason: str) -> None: ...

    def dial_target(self, leg: CallLeg, uri: str) -> Dial:
        """How the new call to a REFER's target goes out (ValueError when it cannot)."""
        ...

    def media_moved(self, leg: CallLeg) -> None:
        """The leg's media now runs on the new dialog (a hold by the referrer is over)."""
        ...

    def report_later(self, kind: WorkerEventType, leg: CallLeg, data: dict[str, Any]) -> None: ...


@dataclass(eq=False)
class _Attempt:
    """The new call a REFER asked for, while it rings."""

    leg: CallLeg
    old: CallHandle  # the referrer's dialog, which the REFER came in
    target: str
    replaces: bool
    at_s: float
    sip: CallHandle | None = None
    rtp: RtpEndpoint | None = None
    sdp: OfferAnswer | None = None
    timer: asyncio.TimerHandle | None = None
    done: bool = False
    progress: list[int] = field(default_factory=list)
    referrer_gone: bool = False  # it hung up after our 202 (a blind transfer): the call waits for the target
    trunk: str | None = None  # the trunk the new call was dialled through (None: none)


class Referrals:
    """Incoming REFERs of one worker's SIP legs (see the module docstring)."""

    def __init__(self, owner: ReferralOwner, *, host: CallHost, signalling: SipSignalling, plant: MediaPlant) -> None:
        self._owner = owner
        self._host = host
        self._signalling = signalling
        self._plant = plant
        self._attempts: dict[CallHandle, _Attempt] = {}  # by the new call's handle
        self._retired: dict[CallHandle, asyncio.TimerHandle] = {}  # referrers' dialogs after a transfer
        self._by_old: dict[CallHandle, _Attempt] = {}  # the ringing attempts by the referrer's dialog

    def claims(self, event: SipEvent) -> bool:
        """Handle ``event`` when it is a REFER's or one of the calls REFERs placed; False: not ours."""
        if isinstance(event, ReferReceived):
            self._received(event)
            return True
        if isinstance(event, TransferDeclined):  # the core's own 400 / 491
            outcome = "invalid" if event.status == 400 else "busy"
            SIP_REFERS_TOTAL.labels(self._host.id, outcome).inc()
            leg = self._owner.by_handle.get(event.call)
            log.info("call %s: REFER refused %d (%s)", leg.id if leg else event.call, event.status, event.reason)
            if leg is not None:
                data = {"target": event.refer_to, "outcome": outcome, "status": event.status, "reason": event.reason}
                self._owner.report_later("call.refer_received", leg, data)
            return True
        handle = getattr(event, "call", None)
        attempt = self._attempts.get(handle) if handle is not None else None
        if attempt is not None:
            self._attempt_event(attempt, event)
            return True
        if handle is not None and handle in self._retired:
            if isinstance(event, CallEnded):
                self._retired.pop(handle).cancel()
            return True
        pending = self._by_old.get(handle) if handle is not None else None
        if pending is not None and isinstance(event, CallEnded) and event.by == "remote":
            # The referrer left before the target answered (RFC 5589 §6's "blind" way): the call stays up
            # with the agent until the new call is answered or fails.
            pending.referrer_gone = True
            log.info("call %s: the referrer hung up; the transfer goes on", pending.leg.id)
            return True
        return False

    def leg_ended(self, leg: CallLeg) -> None:
        """The call is over (whoever ended it): a transfer still ringing for it is called off."""
        for attempt in [a for a in self._by_old.values() if a.leg is leg]:
            self._finish(attempt, 487, "Request Terminated")

    # --- the REFER -------------------------------------------------------------------------------

    def _received(self, event: ReferReceived) -> None:
        leg = self._owner.by_handle.get(event.call)
        if leg is None or leg.state not in (LegState.ACTIVE, LegState.HELD) or leg.session is None:
            self._decline(event.call, 603, "Call not up")
            SIP_REFERS_TOTAL.labels(self._host.id, "declined").inc()
            return
        if any(attempt.leg is leg for attempt in self._by_old.values()):
            # One transfer at a time (the core refuses a second REFER of the same dialog itself; this is one that
            # asked for no NOTIFYs, RFC 4488, or came on another dialog of the call).
            self._decline(event.call, 491, "Transfer in progress")
            SIP_REFERS_TOTAL.labels(self._host.id, "busy").inc()
            return
        at_s = max(0.0, time.time() - (leg.answered_wall or leg.started_wall))
        policy = leg.refer_policy
        host = _host_of(event.refer_to)
        if policy is None or not policy.allows(event.refer_to, host):
            why = "Transfer not allowed" if policy is None or policy.mode == "off" else "Transfer target not allowed"
            self._decline(event.call, 603, why)
            self._record(leg, event.refer_to, event.replaces is not None, at_s, "declined", 603, why)
            SIP_REFERS_TOTAL.labels(self._host.id, "declined").inc()
            log.info("call %s: REFER to %s declined: %s", leg.id, event.refer_to, why)
            data = {"target": event.refer_to, "outcome": "declined", "status": 603, "reason": why}
            self._owner.report_later("call.refer_received", leg, data)
            return
        self._signalling.accept_refer(event.call)
        log.info("call %s: REFER to %s accepted%s", leg.id, event.refer_to, " (Replaces)" if event.replaces else "")
        data = {"target": event.refer_to, "outcome": "accepted", "status": 202, "replaces": event.replaces is not None}
        self._owner.report_later("call.refer_received", leg, data)
        attempt = _Attempt(
            leg=leg, old=event.call, target=event.refer_to, replaces=event.replaces is not None, at_s=at_s
        )
        self._place(attempt, event)

    def _decline(self, call: CallHandle, status: int, reason: str) -> None:
        with contextlib.suppress(LocalProtocolError):
            self._signalling.decline_refer(call, status, reason)

    def _place(self, attempt: _Attempt, event: ReferReceived) -> None:
        leg = attempt.leg
        headers: list[tuple[str, str]] = []
        if event.replaces:
            headers.append(("Replaces", event.replaces))
        headers.append(("Referred-By", event.referred_by or f"<{leg.from_uri}>"))
        try:
            rtp = self._plant.ports.allocate()
        except Exception as exc:  # no port free: the transfer fails, the call goes on
            log.warning("call %s: no RTP port for the transfer: %s", leg.id, exc)
            self._finish(attempt, 503, "Service Unavailable")
            return
        attempt.rtp = rtp
        sdp = attempt.sdp = self._owner.new_offer_answer()
        sdp.bind(address=self._owner.media_address(rtp), port=rtp.port)
        try:
            route = self._owner.dial_target(leg, event.refer_to)
            attempt.trunk = route.trunk.name if route.trunk is not None else None
            attempt.sip = self._signalling.invite(
                route.uri,
                from_uri=_local_uri(leg),
                body=sdp.offer().to_bytes(),
                credentials=route.credentials,
                outbound_proxy=route.outbound_proxy,
                headers=tuple(headers),
            )
        except (LocalProtocolError, RemoteProtocolError, ValueError) as exc:
            log.info("call %s: cannot call the REFER's target %s: %s", leg.id, event.refer_to, exc)
            self._finish(attempt, 400, "Bad Refer-To")
            return
        self._attempts[attempt.sip] = attempt
        self._by_old[attempt.old] = attempt
        attempt.timer = asyncio.get_running_loop().call_later(REFER_RING_TIMEOUT_S, self._ring_timeout, attempt)

    # --- the new call ----------------------------------------------------------------------------

    def _attempt_event(self, attempt: _Attempt, event: SipEvent) -> None:
        if isinstance(event, OutboundCallProgressed):
            if attempt.leg.live and not attempt.done:
                self._notify(attempt, event.status, event.reason)
        elif isinstance(event, OutboundCallAnswered):
            self._answered(attempt, event.body)
        elif isinstance(event, OutboundCallFailed):
            self._finish(attempt, event.status, event.reason)
        elif isinstance(event, CallEnded) and not attempt.done:
            self._finish(attempt, event.status or 487, event.reason or "Request Terminated")

    def _ring_timeout(self, attempt: _Attempt) -> None:
        if attempt.done:
            return
        self._finish(attempt, 487, "Request Terminated")  # hangs the new call up (CANCEL)

    def _answered(self, attempt: _Attempt, body: bytes) -> None:
        leg = attempt.leg
        assert attempt.sdp is not None and attempt.sip is not None and attempt.rtp is not None
        if not leg.live or leg.state not in (LegState.ACTIVE, LegState.HELD) or attempt.done:
            self._finish(attempt, 487, "Request Terminated")  # the call ended while the target rang
            return
        result = attempt.sdp.take_answer(body)
        if isinstance(result, Refused):
            log.info("call %s: the transfer target's answer is unusable: %s", leg.id, result.reason)
            self._finish(attempt, 488, "Not Acceptable Here")
            return
        self._move(attempt)

    def _move(self, attempt: _Attempt) -> None:
        """The call's media moves to the new leg; the session (and its agent) goes on there."""
        leg, owner = attempt.leg, self._owner
        assert attempt.sip is not None and attempt.rtp is not None and attempt.sdp is not None
        owner.detach_media(leg)
        old = attempt.old
        owner.by_handle.pop(old, None)
        leg.sip, leg.rtp, leg.sdp = attempt.sip, attempt.rtp, attempt.sdp
        attempt.rtp = None  # the leg's now
        owner.by_handle[attempt.sip] = leg
        leg.transport = self._signalling.transport_of(attempt.sip)
        owner.start_media(leg)
        owner.media_moved(leg)
        if leg.session is not None:
            # The agent is told who it is talking with now, and greets them (the conversation so far stays).
            with contextlib.suppress(SessionStateError):  # a provider reconnecting: the call goes on regardless
                leg.session.inject(TRANSFERRED_NOTE.format(target=attempt.target), role="system", respond=True)
        self._done(attempt)
        self._notify(attempt, 200, "OK")
        self._record(leg, attempt.target, attempt.replaces, attempt.at_s, "referred", 200, "", trunk=attempt.trunk)
        SIP_REFERS_TOTAL.labels(self._host.id, "referred").inc()
        log.info("call %s: transferred to %s; the agent goes on there", leg.id, attempt.target)
        owner.report_later("call.referred", leg, {"target": attempt.target, "status": 200})
        # The referrer usually hangs up once it has our 200 NOTIFY; if it does not, we do.
        if not attempt.referrer_gone:
            loop = asyncio.get_running_loop()
            self._retired[old] = loop.call_later(REFERRER_BYE_GRACE_S, self._bye_referrer, old)

    def _bye_referrer(self, old: CallHandle) -> None:
        self._retired.pop(old, None)
        self._signalling.hang_up(old, "transferred", headers=(("Reason", reason_value("transferred")),))

    def _finish(self, attempt: _Attempt, status: int, reason: str) -> None:
        """The transfer failed: the referrer is told, the new call (if any) is let go, the call goes on."""
        if attempt.done:
            return
        self._done(attempt)
        leg = attempt.leg
        if attempt.sip is not None:
            self._signalling.hang_up(attempt.sip, "transfer_failed")
        if attempt.rtp is not None:
            self._plant.ports.release(attempt.rtp)
            attempt.rtp = None
        self._notify(attempt, status, reason)
        self._record(leg, attempt.target, attempt.replaces, attempt.at_s, "failed", status, reason, trunk=attempt.trunk)
        SIP_REFERS_TOTAL.labels(self._host.id, "failed").inc()
        log.info("call %s: transfer to %s failed: %d %s", leg.id, attempt.target, status, reason)
        if leg.live:
            data = {"target": attempt.target, "status": status, "reason": reason}
            self._owner.report_later("call.refer_failed", leg, data)
            if attempt.referrer_gone:
                self._owner.end(leg, "caller_hangup")  # nobody is left on the call

    def _done(self, attempt: _Attempt) -> None:
        attempt.done = True
        if attempt.timer is not None:
            attempt.timer.cancel()
        if attempt.sip is not None:
            self._attempts.pop(attempt.sip, None)
        if self._by_old.get(attempt.old) is attempt:
            del self._by_old[attempt.old]

    def _notify(self, attempt: _Attempt, status: int, reason: str) -> None:
        attempt.progress.append(status)
        if attempt.referrer_gone:
            return
        with contextlib.suppress(LocalProtocolError):  # the referrer's dialog is gone: nobody to tell
            self._signalling.notify_refer(attempt.old, status, reason)

    @staticmethod
    def _record(
        leg: CallLeg,
        target: str,
        replaces: bool,
        at_s: float,
        outcome: Outcome,
        status: int,
        detail: str,
        *,
        trunk: str | None = None,
    ) -> None:
        if len(leg.referrals) < 32:
            line = ReferralLine(
                at_s=at_s,
                target=target[:512],
                replaces=replaces,
                outcome=outcome,
                status=status,
                detail=detail[:200],
                trunk=trunk,
            )
            leg.referrals.append(line)

    def aclose(self) -> None:
        """The worker stops: transfers still ringing are called off, referrers still on the line get their BYE."""
        for attempt in list(self._attempts.values()):
            self._finish(attempt, 503, "Service Unavailable")
        for old, timer in list(self._retired.items()):
            timer.cancel()
            self._bye_referrer(old)


def _host_of(uri: str) -> str:
    try:
        return parse_uri(uri).host
    except RemoteProtocolError:
        return ""


def _local_uri(leg: CallLeg) -> str:
    """Who we are on the new call: the number the caller dialled (inbound), our caller id (outbound)."""
    uri = leg.to_uri if leg.direction == "inbound" else leg.from_uri
    return uri if uri.startswith(("sip:", "sips:")) else f"sip:{uri or 'gateway'}@invalid"
