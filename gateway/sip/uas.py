"""Requests from the peer: the UAS half of the core (RFC 3261 §8.2, §9.2, §12.2.2, §13.3, §14.2, §15.1.2).

Owns: `handle_request`, called with a parsed, validated, policy-approved request whose top Via has been
stamped with received/rport. Order of checks (§8.2): transaction match (retransmissions are absorbed or
answered by their transaction) -> method (501 unknown, 405 known but not allowed) -> merged request (482)
-> Require (420 + Unsupported) -> dialog match (481, CSeq order 500) -> the method's own handling:

    INVITE (initial)   100 Trying, Dialog, CallOffered; 422 when Session-Expires < Min-SE; 503 when full;
                       Require: 100rel -> our 18x go reliably, PRACKed (gateway/sip/prack.py)
    INVITE (re-)       491 on glare with ours, 500 + Retry-After while one of theirs is pending;
                       else ReinviteReceived (the application answers)
    UPDATE             same glare rules; with a body -> ReinviteReceived, without -> 200 (a refresh)
    ACK                for our 2xx: CallEstablished, or completes a re-INVITE (ReinviteAcked when it carries the
                       answer to the offer of our 2xx); others are absorbed
    CANCEL             matched to the INVITE by branch (481 if none); 200, then 487 for the INVITE if it
                       has no final response yet (CallCancelled + CallEnded); after a 2xx: only the 200
    BYE                200, CallEnded(by="remote"); 487 to an INVITE or re-INVITE still pending
    INFO               application/dtmf-relay -> DtmfInfoReceived; other bodies -> 415
    OPTIONS            200 with Allow/Accept/Supported, in or out of a dialog -> OptionsReceived
                       (out of dialog while not accepting calls, i.e. draining: 503 + Retry-After)
    REFER              400 without one usable Refer-To, 491 while another is pending -> TransferDeclined;
                       else ReferReceived (the application accepts: 202 + NOTIFYs, or declines: 603;
                       gateway/sip/refer_sub.py has the subscription's table)
    NOTIFY             Event: refer with a message/sipfrag body -> TransferProgressed / TransferFailed
    PRACK              200 when its RAck names our reliable 18x, else 481 (gateway/sip/prack.py)
"""

from __future__ import annotations

import re

from .call import Call, CallState
from .core import ALLOWED_METHODS, KNOWN_METHODS, UAS_OPTIONS, Core, merge_key
from .dialog import Dialog
from .errors import RemoteProtocolError
from .events import (
    Address,
    CallCancelled,
    CallEstablished,
    CallOffered,
    DtmfInfoReceived,
    OptionsReceived,
    ReferReceived,
    ReinviteAcked,
    ReinviteReceived,
    SessionRefreshed,
    TransferDeclined,
    TransferFailed,
    TransferProgressed,
)
from .message import SipRequest, is_rfc3261
from .prack import for_invite, on_prack
from .refer_sub import SIPFRAG_CONTENT_TYPE, ReferAction, ReferSubscription, parse_refer_to
from .session_timer import negotiate_as_uas
from .transaction import Transaction, TxInput, TxState, server_key
from .uac import send_bye, send_in_dialog

_DTMF_SIGNALS = frozenset("0123456789*#ABCDabcd")
_SIPFRAG_RE = re.compile(rb"^\s*SIP/2\.0\s+(\d{3})\s*([^\r\n]*)")


def handle_request(core: Core, request: SipRequest, source: Address, transport: str, now: float) -> None:
    method = request.method
    if method == "ACK":
        tx = core.server_txs.get(server_key(request))
        if tx is not None and tx.state is not TxState.ACCEPTED:
            core.apply(tx, tx.handle(TxInput.ACK, now), now)  # ACK for a 3xx-6xx: ends its transaction
        else:
            _ack(core, request, now)
        return
    tx = core.server_txs.get(server_key(request))
    if tx is not None:
        core.stats.retransmissions_received += 1
        core.apply(tx, tx.handle(TxInput.REQUEST, now), now)
        return
    if method not in KNOWN_METHODS:
        core.reply_stateless(request, 501, source, transport)
        return
    if method not in ALLOWED_METHODS:
        core.reply_stateless(request, 405, source, transport, headers=(("Allow", ", ".join(ALLOWED_METHODS)),))
        return
    if method == "CANCEL":
        _cancel(core, request, source, transport, now)
        return
    to_tag = request.to.tag
    if to_tag is None and merge_key(request) in core.merge_index:
        core.reply_stateless(request, 482, source, transport)  # §8.2.2.2 merged request
        return
    unsupported = sorted(request.headers.tokens("Require") - set(UAS_OPTIONS))
    if unsupported:
        core.reply_stateless(request, 420, source, transport, headers=(("Unsupported", ", ".join(unsupported)),))
        return
    if to_tag is None:
        _out_of_dialog(core, request, source, transport, now)
        return
    call = core.call_for_dialog((request.call_id, to_tag, request.from_.tag or ""))
    if call is None or call.dialog is None:
        core.reply_stateless(request, 481, source, transport)
        return
    if not call.dialog.accept_remote_cseq(request.cseq.number, method):
        core.reply_stateless(request, 500, source, transport, reason="CSeq out of order")
        return
    tx = core.start_server(request, source, transport, now)
    tx.context = call
    _IN_DIALOG[method](core, call, tx, now)


def _out_of_dialog(core: Core, request: SipRequest, source: Address, transport: str, now: float) -> None:
    if request.method == "INVITE":
        _new_call(core, request, source, transport, now)
        return
    tx = core.start_server(request, source, transport, now)
    if request.method == "OPTIONS":
        _options(core, None, tx, now)
    else:
        core.respond(tx, 481, now, to_tag=core.token(32))


def _new_call(core: Core, request: SipRequest, source: Address, transport: str, now: float) -> None:
    if len(core.calls) >= core.config.max_calls:
        core.reply_stateless(request, 503, source, transport, headers=(("Retry-After", "5"),))
        return
    if not request.contacts and is_rfc3261(request):
        # §8.1.1.8 makes Contact mandatory; an RFC 2543 peer (no magic cookie in its branch, RFC 4475 §3.4.1
        # inv2543) may leave it out, and its From URI is then where in-dialog requests go (Dialog.for_uas).
        core.reply_stateless(request, 400, source, transport, reason="Missing Contact")
        return
    try:
        timer, timer_headers = negotiate_as_uas(request, core.config.session_timer, now)
    except RemoteProtocolError as exc:
        core.reply_stateless(request, exc.status_code, source, transport, reason=exc.reason, headers=exc.headers)
        return
    tx = core.start_server(request, source, transport, now)
    core.respond(tx, 100, now)
    local_tag = core.token(32)
    call = Call(
        handle=core.new_handle(),
        role="uas",
        state=CallState.OFFERED,
        transport=transport,
        peer=source,
        secure=request.uri.scheme == "sips" and transport == "tls",
        invite=request,
        local_tag=local_tag,
        invite_tx=tx,
        dialog=Dialog.for_uas(request, local_tag, transport=transport),
        session_timer=timer,
        answer_headers=timer_headers,
        peer_allow=request.headers.tokens("Allow"),
        reliable=for_invite(core, request.headers.tokens("Require")),
    )
    tx.context = call
    core.add_call(call)
    core.bind_dialog(call)
    sender = request.from_
    core.emit(
        CallOffered(
            call=call.handle,
            call_id=request.call_id,
            source=source,
            transport=transport,
            request_uri=str(request.uri),
            from_uri=str(sender.uri),
            from_display_name=sender.display_name,
            to_uri=str(request.to.uri),
            headers=tuple(request.headers),
            body=request.body,
            content_type=request.content_type,
        )
    )


def _ack(core: Core, request: SipRequest, now: float) -> None:
    call = core.call_for_dialog((request.call_id, request.to.tag or "", request.from_.tag or ""))
    ok = call.ok_response if call is not None else None
    if call is None or ok is None or ok.cseq.number != request.cseq.number:
        core.stats.unmatched_acks += 1
        return
    call.ok_response = None
    call.ok_next = call.ok_give_up = None
    if call.state is CallState.ANSWERED:
        call.state = CallState.CONFIRMED
        if call.session_timer is not None:
            call.session_timer.refreshed(now)
        if not call.end_reported:  # hung up while the ACK was on its way: only the BYE is left to do
            core.emit(CallEstablished(call=call.handle, body=request.body))
        if call.bye_pending is not None:
            reason = call.bye_pending
            call.bye_pending = None
            send_bye(core, call, now)
            core.end_call(call, reason=reason, by="local")
    elif call.state is CallState.CONFIRMED and request.body and not call.end_reported:
        core.emit(ReinviteAcked(call=call.handle, body=request.body))


def _cancel(core: Core, request: SipRequest, source: Address, transport: str, now: float) -> None:
    via = request.top_via
    host, port = via.sent_by
    invite_tx = core.server_txs.get((via.branch or "", host, str(port), "INVITE"))
    if invite_tx is None:
        invite_tx = next(
            (
                tx
                for tx in core.server_txs.values()
                if tx.request.method == "INVITE" and tx.request.top_via.branch == via.branch and via.branch
            ),
            None,
        )
    if invite_tx is None:
        core.reply_stateless(request, 481, source, transport)
        return
    cancel_tx = core.start_server(request, source, transport, now)
    call = invite_tx.context if isinstance(invite_tx.context, Call) else None
    core.respond(cancel_tx, 200, now, to_tag=call.local_tag if call else core.token(32))
    if invite_tx.state is not TxState.PROCEEDING or call is None:
        return  # a final response was already sent: the CANCEL has no effect (§9.2)
    core.respond(invite_tx, 487, now, to_tag=call.local_tag)
    held = call.reliable is not None and call.reliable.held_final is not None  # our 2xx waits for a PRACK
    if call.state is CallState.OFFERED or held:
        if held and call.reliable is not None:
            call.reliable.held_final = None
        core.emit(CallCancelled(call=call.handle))
        core.end_call(call, reason="cancelled", by="remote", status=487)


def _bye(core: Core, call: Call, tx: Transaction, now: float) -> None:
    core.respond(tx, 200, now)
    held = call.reliable is not None and call.reliable.held_final is not None  # our 2xx waits for a PRACK
    unanswered = call.state is CallState.OFFERED or held
    for pending in (call.incoming_update_tx, call.invite_tx if unanswered else None):
        if pending is not None and pending.state is TxState.PROCEEDING:
            core.respond(pending, 487, now, to_tag=call.local_tag)
    call.bye_pending = None
    core.end_call(call, reason="remote hangup", by="remote")


def _glare(core: Core, call: Call, tx: Transaction, now: float) -> bool:
    """§14.2: 491 while our own offer is pending, 500 + Retry-After while theirs is."""
    if call.outgoing_update_tx is not None:
        core.respond(tx, 491, now)
        return True
    if call.incoming_update_tx is not None or call.state is not CallState.CONFIRMED:
        core.respond(tx, 500, now, headers=(("Retry-After", str(core.rng.randint(0, 10))),))
        return True
    return False


def _session_refresh(core: Core, call: Call, tx: Transaction, now: float) -> tuple[tuple[str, str], ...] | None:
    """Negotiate a refresh request; None when it was answered with an error (422) already."""
    try:
        timer, headers = negotiate_as_uas(tx.request, core.config.session_timer, now)
    except RemoteProtocolError as exc:
        core.respond(tx, exc.status_code, now, reason=exc.reason, headers=exc.headers)
        return None
    if timer is not None:
        call.session_timer = timer
    return headers


def _reinvite(core: Core, call: Call, tx: Transaction, now: float) -> None:
    if tx.request.method == "INVITE":
        core.respond(tx, 100, now)
    if _glare(core, call, tx, now):
        return
    headers = _session_refresh(core, call, tx, now)
    if headers is None:
        return
    call.answer_headers = headers
    assert call.dialog is not None
    request = tx.request
    if request.method == "UPDATE" and not request.body:
        call.dialog.refresh_target(request)
        contact = core.contact(call.transport, secure=call.secure)
        core.respond(tx, 200, now, headers=(("Contact", contact), *headers))
        if call.session_timer is not None:
            core.emit(SessionRefreshed(call=call.handle, interval=call.session_timer.interval, by="remote"))
        return
    call.incoming_update_tx = tx
    core.emit(
        ReinviteReceived(
            call=call.handle,
            method=request.method,
            body=request.body or None,
            content_type=request.content_type,
        )
    )


def parse_dtmf_relay(body: bytes) -> tuple[str, int] | None:
    """`Signal=5` / `Duration=160` lines of application/dtmf-relay -> (digit, milliseconds)."""
    fields: dict[str, str] = {}
    for line in body.decode("utf-8", "replace").splitlines():
        name, eq, value = line.partition("=")
        if eq:
            fields[name.strip().lower()] = value.strip()
    signal = fields.get("signal", "")
    duration = fields.get("duration", "160")
    if len(signal) != 1 or signal not in _DTMF_SIGNALS or not (duration.isascii() and duration.isdigit()):
        return None
    return signal.upper(), int(duration)


def _info(core: Core, call: Call, tx: Transaction, now: float) -> None:
    request = tx.request
    if request.content_type == "application/dtmf-relay":
        parsed = parse_dtmf_relay(request.body)
        if parsed is None:
            core.respond(tx, 400, now, reason="Bad dtmf-relay body")
            return
        core.respond(tx, 200, now)
        core.emit(DtmfInfoReceived(call=call.handle, digit=parsed[0], duration_ms=parsed[1]))
        return
    if not request.body:
        core.respond(tx, 200, now)  # an empty INFO is a keepalive probe
        return
    core.respond(tx, 415, now, headers=(("Accept", "application/dtmf-relay"),))


def _options(core: Core, call: Call | None, tx: Transaction, now: float) -> None:
    headers = (*core.common_headers(response=True), ("Accept", "application/sdp"))
    if call is None and not core.accepting_calls:
        core.respond(tx, 503, now, to_tag=core.token(32), headers=(*headers, ("Retry-After", "30")))
        core.emit(OptionsReceived(call=None, source=tx.peer))
        return
    core.respond(tx, 200, now, to_tag=core.token(32) if call is None else None, headers=headers)
    core.emit(OptionsReceived(call=call.handle if call else None, source=tx.peer))


def _options_in_dialog(core: Core, call: Call, tx: Transaction, now: float) -> None:
    _options(core, call, tx, now)


def _refer(core: Core, call: Call, tx: Transaction, now: float) -> None:
    request = tx.request
    values = request.headers.values("Refer-To")
    try:
        target = parse_refer_to(values)
    except RemoteProtocolError as exc:
        core.respond(tx, 400, now, reason=exc.reason[:100])
        core.emit(TransferDeclined(call=call.handle, refer_to=",".join(values), status=400, reason=exc.reason))
        return
    if call.state is not CallState.CONFIRMED or (call.refer_in is not None and call.refer_in.pending):
        core.respond(tx, 491, now, reason="Transfer in progress" if call.refer_in else None)
        core.emit(TransferDeclined(call=call.handle, refer_to=target.uri, status=491, reason="Request Pending"))
        return
    refer_sub = (request.headers.get("Refer-Sub") or "").strip().lower() != "false"
    call.refer_in = ReferSubscription(
        target=target,
        refer_cseq=request.cseq.number,
        first_in_dialog=call.refers_received == 0,
        subscription=refer_sub,
    )
    call.refer_in_tx = tx
    call.refers_received += 1
    referred_by = request.headers.get("Referred-By")
    core.emit(
        ReferReceived(
            call=call.handle,
            refer_to=target.uri,
            replaces=target.replaces,
            referred_by=referred_by,
            subscription=refer_sub,
        )
    )


def send_refer_action(core: Core, call: Call, action: ReferAction, now: float) -> None:
    """Put an incoming REFER's answer (202 / 603) and its NOTIFY on the wire (RFC 3515 §2.4.4, §2.4.5)."""
    tx = call.refer_in_tx
    if action.status is not None and tx is not None:
        call.refer_in_tx = None
        core.respond(tx, action.status, now, reason=action.reason, headers=action.headers)
    if action.notify_body and call.dialog is not None and not call.end_reported:
        send_in_dialog(
            core,
            call,
            "NOTIFY",
            now,
            body=action.notify_body,
            content_type=SIPFRAG_CONTENT_TYPE,
            headers=action.notify_headers,
        )


def _notify(core: Core, call: Call, tx: Transaction, now: float) -> None:
    request = tx.request
    event = (request.headers.get("Event") or "").split(";")[0].strip().lower()
    if event != "refer" or not call.refer_pending:
        core.respond(tx, 481, now)
        return
    core.respond(tx, 200, now)
    state = (request.headers.get("Subscription-State") or "").split(";")[0].strip().lower()
    match = _SIPFRAG_RE.match(request.body) if request.content_type == "message/sipfrag" else None
    if match is None:
        if state == "terminated":
            call.refer_pending = False
        return
    status, reason = int(match.group(1)), match.group(2).decode("utf-8", "replace").strip()
    final = status >= 200 or state == "terminated"
    if final:
        call.refer_pending = False
    if status >= 300:
        core.emit(TransferFailed(call=call.handle, status=status, reason=reason))
    else:
        core.emit(TransferProgressed(call=call.handle, status=status, reason=reason, final=final))


_IN_DIALOG = {
    "INVITE": _reinvite,
    "UPDATE": _reinvite,
    "BYE": _bye,
    "INFO": _info,
    "OPTIONS": _options_in_dialog,
    "REFER": _refer,
    "NOTIFY": _notify,
    "PRACK": on_prack,
}
