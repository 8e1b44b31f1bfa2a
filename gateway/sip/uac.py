"""Requests we send and the responses to them: the UAC half of the core (RFC 3261 §8.1, §9.1, §12.2.1,
§13.2, §14.1, §22.2; RFC 4028 refreshes; RFC 3515 REFER).

Owns: building the initial INVITE and in-dialog requests, the ACK for a 2xx (sent by the core, outside the
transaction, §13.2.2.4; re-sent for each 2xx retransmission), CANCEL (§9.1: only once a provisional came),
and `on_response`, where client transactions hand their responses (or timeouts, as None):

    INVITE   1xx  -> OutboundCallProgressed (>100), a PRACK when reliable (prack.py); a wanted CANCEL goes out now
             2xx  -> Dialog, ACK, OutboundCallAnswered, session timer from Session-Expires; after a CANCEL
                     or from a second fork: ACK then BYE
             401/407 with credentials (once) or 422 with Min-SE (once) -> the INVITE again, CSeq + 1
             3xx-6xx, timeout -> OutboundCallFailed + CallEnded
    re-INVITE / UPDATE  2xx -> ACK (INVITE), ReinviteAnswered or SessionRefreshed;
             408/481/timeout -> BYE + CallEnded (§14.1, §12.2.1.2); others -> ReinviteFailed
    REFER    2xx -> TransferProgressed(202); failure or timeout -> TransferFailed
    NOTIFY   (of an incoming REFER's subscription) 408/481/timeout -> no more NOTIFYs (refer_sub.py)
    OPTIONS  (out of dialog) -> OptionsAnswered
    any      transport error (the glue could not connect or finish TLS) -> as a 503; the initial INVITE's
             OutboundCallFailed names the cause (on_transport_error)
"""

from __future__ import annotations

from dataclasses import dataclass

from .call import Call, CallState
from .core import Core
from .dialog import Dialog
from .errors import RemoteProtocolError
from .events import (
    OptionsAnswered,
    OutboundCallAnswered,
    OutboundCallFailed,
    OutboundCallProgressed,
    ReinviteAnswered,
    ReinviteFailed,
    SessionRefreshed,
    TransferFailed,
    TransferProgressed,
)
from .message import SipRequest, SipResponse, make_response
from .prack import prack_reliable
from .session_timer import min_se_of_422, negotiate_as_uac, offer_headers
from .transaction import Transaction, TransportErrorReported


@dataclass(frozen=True, kw_only=True)
class OptionsPing:
    """Context of an out-of-dialog OPTIONS sent with `SipEndpoint.send_options`."""

    request_id: str


def start_invite(core: Core, call: Call, now: float) -> None:
    call.invite_tx = core.start_client(call.invite, call.peer, call.transport, now, context=call)


def retry_invite(core: Core, call: Call, now: float, headers: tuple[tuple[str, str], ...]) -> None:
    """The same INVITE with CSeq + 1, a new branch and `headers` replacing those of the same name."""
    old = call.invite
    invite = SipRequest(method="INVITE", uri=old.uri, body=old.body)
    names = {name.lower() for name, _ in headers}
    for name, value in old.headers:
        if name == "Via":
            value = core.via(call.transport)
        elif name == "CSeq":
            value = f"{old.cseq.number + 1} INVITE"
        elif name.lower() in names:
            continue
        invite.headers.add(name, value)
    for name, value in headers:
        invite.headers.add(name, value)
    call.invite = invite
    start_invite(core, call, now)


def send_in_dialog(
    core: Core,
    call: Call,
    method: str,
    now: float,
    *,
    body: bytes = b"",
    content_type: str | None = None,
    headers: tuple[tuple[str, str], ...] = (),
) -> Transaction:
    dialog = call.dialog
    assert dialog is not None, "in-dialog request without a dialog"
    destination, transport, flow = core.next_hop(call)
    request = dialog.build_request(method, via=core.via(transport))
    if method in ("INVITE", "UPDATE", "REFER", "NOTIFY"):
        request.headers.add("Contact", core.contact(transport, secure=call.secure))
    for name, value in headers:
        request.headers.add(name, value)
    if core.config.user_agent:
        request.headers.add("User-Agent", core.config.user_agent)
    if body:
        request.headers.add("Content-Type", content_type or "application/sdp")
        request.body = body
    return core.start_client(request, destination, transport, now, context=call, flow=flow)


def send_bye(core: Core, call: Call, now: float) -> None:
    if call.dialog is not None:
        send_in_dialog(core, call, "BYE", now, headers=call.bye_headers)


def send_cancel(core: Core, call: Call, now: float) -> None:
    """§9.1: same Request-URI, Call-ID, From, To, CSeq number and top Via (branch) as the INVITE."""
    invite = call.invite
    cancel = SipRequest(method="CANCEL", uri=invite.uri)
    cancel.headers.add("Via", invite.headers.values("Via")[0])
    for route in invite.headers.lines("Route"):
        cancel.headers.add("Route", route)
    cancel.headers.add("Max-Forwards", "70")
    for name in ("From", "To", "Call-ID"):
        cancel.headers.add(name, invite.headers.get(name) or "")
    cancel.headers.add("CSeq", f"{invite.cseq.number} CANCEL")
    call.cancel_sent = True
    core.start_client(cancel, call.peer, call.transport, now, context=call)


def _send_ack(core: Core, call: Call, dialog: Dialog, invite: SipRequest) -> SipRequest:
    """§13.2.2.4: the ACK for a 2xx is a new request in the dialog with the INVITE's CSeq number."""
    _, transport, _ = core.next_hop(call, dialog)
    ack = dialog.build_request("ACK", via=core.via(transport), cseq=invite.cseq.number)
    core.send_in_dialog(call, ack.encode(), dialog)
    return ack


def _resend_ack(core: Core, call: Call, ack: SipRequest) -> None:
    if call.dialog is not None:
        core.stats.retransmissions_sent += 1
        core.send_in_dialog(call, ack.encode())


def on_response(core: Core, tx: Transaction, response: SipResponse | None, now: float) -> None:
    context = tx.context
    if isinstance(context, OptionsPing):
        if response is None or response.status >= 200:
            status = 408 if response is None else response.status
            core.emit(OptionsAnswered(request_id=context.request_id, status=status))
        return
    if not isinstance(context, Call):
        return
    method = tx.request.method
    if method == "INVITE" and tx is context.invite_tx:
        _initial_invite_response(core, context, tx, response, now)
    elif method in ("INVITE", "UPDATE") and tx is context.outgoing_update_tx:
        _update_response(core, context, tx, response, now)
    elif method == "INVITE" and response is not None and 200 <= response.status < 300 and tx.ack is not None:
        _resend_ack(core, context, tx.ack)  # a re-INVITE's 2xx retransmitted: our ACK was lost
    elif method == "REFER":
        _refer_response(core, context, response)
    elif method == "NOTIFY" and context.refer_in is not None and (response is None or response.status in (408, 481)):
        context.refer_in.notify_failed()  # the referrer ended the subscription (RFC 6665 §4.1.2.2): no more NOTIFYs
    elif method in ("BYE", "INFO") and response is not None and response.status in (408, 481):
        core.end_call(context, reason=f"{method} failed", by="remote", status=response.status)


def on_transport_error(core: Core, tx: Transaction, error: TransportErrorReported, now: float) -> None:
    """The request never reached the peer: the initial INVITE fails its call with 503 and the cause; any other
    request is answered as if by a 503 (§8.1.3.1) and handled as such."""
    context = tx.context
    if isinstance(context, Call) and tx.request.method == "INVITE" and tx is context.invite_tx:
        _fail(core, context, 503, error.detail, transport_error=error.cause)
        return
    reason = " ".join(error.detail.split())[:100] or "Service Unavailable"
    core.on_response(tx, make_response(tx.request, 503, reason), now)  # the endpoint's: registrations' too


def _initial_invite_response(core: Core, call: Call, tx: Transaction, response: SipResponse | None, now: float) -> None:
    if response is None:
        _fail(core, call, 408, "no response")
        return
    status = response.status
    if status < 200:
        call.provisional_seen = True
        if call.cancel_wanted and not call.cancel_sent:
            send_cancel(core, call, now)
        elif status > 100 and call.state is CallState.CALLING:
            prack_reliable(core, call, tx.request, response, now)
            core.emit(
                OutboundCallProgressed(
                    call=call.handle,
                    status=status,
                    reason=response.reason,
                    body=response.body,
                    content_type=response.content_type,
                    to_tag=response.to.tag,
                )
            )
        return
    if status < 300:
        _invite_answered(core, call, tx, response, now)
        return
    if call.state is not CallState.CALLING:
        return
    if status in (401, 407) and call.credentials is not None and not call.auth_retried:
        call.auth_retried = True
        challenge_name, answer_name = (
            ("WWW-Authenticate", "Authorization") if status == 401 else ("Proxy-Authenticate", "Proxy-Authorization")
        )
        challenge = response.headers.get(challenge_name)
        answer = (
            call.credentials.authorization(
                challenge=challenge, method="INVITE", uri=str(call.invite.uri), body=call.invite.body
            )
            if challenge
            else None
        )
        if answer is not None:
            retry_invite(core, call, now, ((answer_name, answer),))
            return
    if status == 422 and not call.min_se_retried:
        min_se = min_se_of_422(response)
        if min_se is not None:
            call.min_se_retried = True
            config = core.config.session_timer
            retry_invite(core, call, now, offer_headers(config, interval=max(min_se, config.min_se)))
            return
    _fail(core, call, status, response.reason)


def _fail(core: Core, call: Call, status: int, reason: str, *, transport_error: str | None = None) -> None:
    if call.state is CallState.CALLING and not call.end_reported:
        core.emit(OutboundCallFailed(call=call.handle, status=status, reason=reason, transport_error=transport_error))
    core.end_call(call, reason=reason or "failed", by="remote", status=status)


def _invite_answered(core: Core, call: Call, tx: Transaction, response: SipResponse, now: float) -> None:
    try:
        dialog = Dialog.for_uac(tx.request, response, transport=call.transport)
    except RemoteProtocolError:
        core.stats.malformed_dropped += 1
        return
    early_seq = call.prack_client.local_seq(dialog.remote_tag) if call.prack_client is not None else None
    if early_seq is not None:
        dialog.local_seq = max(dialog.local_seq, early_seq)  # our PRACKs used CSeq numbers of this dialog
    if call.dialog is not None and call.dialog.id == dialog.id:
        if call.ack is not None:  # retransmitted 2xx: our ACK was lost
            _resend_ack(core, call, call.ack)
        return
    ack = _send_ack(core, call, dialog, tx.request)
    if call.dialog is not None or call.state is not CallState.CALLING:
        # A second fork answered, or we hung up meanwhile (CANCEL crossed the 2xx): end this dialog.
        stray = Call(
            handle=call.handle,
            role="uac",
            state=CallState.CONFIRMED,
            transport=call.transport,
            peer=call.peer,
            secure=call.secure,
            invite=tx.request,
            local_tag=dialog.local_tag,
            dialog=dialog,
        )
        send_bye(core, stray, now)
        return
    call.dialog = dialog
    call.ack = ack
    tx.ack = ack
    call.state = CallState.CONFIRMED
    call.peer_allow = response.headers.tokens("Allow")
    call.session_timer = negotiate_as_uac(response, now)
    core.bind_dialog(call)
    core.emit(
        OutboundCallAnswered(
            call=call.handle, body=response.body, content_type=response.content_type, to_tag=dialog.remote_tag
        )
    )


def _update_response(core: Core, call: Call, tx: Transaction, response: SipResponse | None, now: float) -> None:
    method = tx.request.method
    if response is not None and response.status < 200:
        return
    call.outgoing_update_tx = None
    refresh = call.refresh_in_flight
    call.refresh_in_flight = False
    if response is not None and response.status < 300:
        if method == "INVITE" and call.dialog is not None:
            tx.ack = _send_ack(core, call, call.dialog, tx.request)
        if call.dialog is not None:
            call.dialog.refresh_target(response)
        timer = negotiate_as_uac(response, now)
        if timer is not None or call.session_timer is not None:
            call.session_timer = timer
        if call.state is not CallState.CONFIRMED:
            return
        if refresh and timer is not None:
            core.emit(SessionRefreshed(call=call.handle, interval=timer.interval, by="local"))
        elif not refresh:
            core.emit(ReinviteAnswered(call=call.handle, method=method, body=response.body))
        return
    status = 408 if response is None else response.status
    if status in (408, 481):
        send_bye(core, call, now)
        core.end_call(call, reason=f"{method} failed", by="remote", status=status)
    elif not refresh:
        reason = "no response" if response is None else response.reason
        core.emit(ReinviteFailed(call=call.handle, method=method, status=status, reason=reason))
    elif call.session_timer is not None:
        call.session_timer.refresh_sent = True  # keep watching expiry; the peer may still refresh


def _refer_response(core: Core, call: Call, response: SipResponse | None) -> None:
    if response is not None and response.status < 200:
        return
    if response is not None and response.status < 300:
        core.emit(TransferProgressed(call=call.handle, status=response.status, reason=response.reason, final=False))
        return
    call.refer_pending = False
    status = 408 if response is None else response.status
    reason = "no response" if response is None else response.reason
    core.emit(TransferFailed(call=call.handle, status=status, reason=reason))
