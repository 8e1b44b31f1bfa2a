"""The SIP user-agent core: the one object the transport glue and the worker drive (sans-I/O).

Owns: `SipEndpoint`. The glue feeds it bytes with `receive(data, source, transport=..., now=...)` (a whole
datagram, or one message cut by `framing.StreamFramer` for TCP), calls `handle_timers(now)` at
`next_deadline()`, and sends everything `datagrams()` returns; the application reads `events()` and acts
with the methods below (every action takes `now`). `receive` never raises: input that cannot be accepted
is answered (400, 403, 416, 420, 482, 501, 505, ...) when a response can be built, else counted in
`stats` and dropped (§8.2, §16.3 of STYLE: bad input is expected).

Receive path (§18.2.1, RFC 3581, §8.2): parse -> stamp the top Via with received/rport -> §8.2 checks
(required headers, CSeq/method, Request-URI scheme 416, Max-Forwards 483) -> inbound policy (rate limit
drop, allow-list 403, digest 401) -> uas.handle_request. Responses go to their client transaction
(uac.on_response); an unmatched 2xx to an INVITE gets its ACK again (§13.2.2.4).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Sequence

from .auth import ClientCredentials
from .call import Call, CallState
from .config import CONFIGURED_PROXY, ProxyChoice, SipConfig
from .core import Core
from .early_media import check_early, check_final
from .errors import LocalProtocolError, MalformedMessageError, RemoteProtocolError
from .events import (
    Address,
    AuthenticationFailed,
    CallHandle,
    Outgoing,
    ReinviteFailed,
    SessionRefreshed,
    SipEvent,
    SipStats,
    SourceBlocked,
)
from .headers import parse_via
from .message import SipRequest, SipResponse, can_answer, parse_message, validate_request
from .policy import InboundPolicy, Verdict
from .prack import fire as fire_prack
from .prack import hold_final, send_provisional
from .refer_sub import ReferAction, ReferSubscription
from .registrations import Registrations
from .replaces import refer_to_replacing
from .session_timer import offer_headers, refresh_headers
from .transaction import Transaction
from .uac import OptionsPing, on_response, on_transport_error, send_bye, send_cancel, send_in_dialog, start_invite
from .uas import handle_request, send_refer_action
from .uri import NameAddr, SipUri, parse_name_addr, parse_uri

Headers = Sequence[tuple[str, str]]
# sips: only over TLS (RFC 5630 §3.1.3: no "last hop exception"); over UDP or TCP it earns 416 like an unknown scheme.
ACCEPTED_REQUEST_SCHEMES = ("sip", "sips", "tel")


class SipEndpoint:
    """One per worker. See the module docstring for the driving loop and uas.py / uac.py for the rules."""

    def __init__(self, config: SipConfig, *, rng: random.Random | None = None) -> None:
        self.config = config
        # Tags, branches and Call-IDs need only be unique and unguessable enough; tests pass a seeded rng.
        self._core = Core(config, rng or random.Random())
        self._core.on_response = self._on_client_response
        self._core.on_transport_error = lambda tx, error, now: on_transport_error(self._core, tx, error, now)
        # Outbound registrations (RFC 3261 §10.2): `registrations.add(RegistrationConfig(...), now)`.
        self.registrations = Registrations(self._core)
        self.last_internal_error: Exception | None = None
        self._policy = InboundPolicy(
            allow_cidrs=config.allow_cidrs,
            rate_limit=config.rate_limit,
            authenticator=config.authenticator,
            lockout=config.lockout,
            scanner_agents=config.scanner_agents,
            trunks=config.trunks,
        )

    # --- driving ---------------------------------------------------------------------------------

    @property
    def stats(self) -> SipStats:
        return self._core.stats

    @property
    def accepting_calls(self) -> bool:
        return self._core.accepting_calls

    def set_accepting_calls(self, accepting: bool) -> None:
        """A draining worker stops accepting: out-of-dialog OPTIONS are answered 503 so balancers move on."""
        self._core.accepting_calls = accepting

    @property
    def call_count(self) -> int:
        return len(self._core.calls)

    def receive(self, data: bytes, source: Address, *, transport: str, now: float) -> None:
        """Feed one message (UDP datagram or framed TCP message). Never raises."""
        stats = self._core.stats
        stats.messages_received += 1
        try:
            self._receive(data, source, transport, now)
        except RemoteProtocolError:
            stats.malformed_dropped += 1
        except Exception as exc:  # the boundary of §"errors are modelled": a core bug must not kill the worker
            stats.internal_errors += 1
            self.last_internal_error = exc  # for the glue to log: the core itself does no I/O

    def handle_timers(self, now: float) -> None:
        """Fire every timer due at `now` (transactions, 2xx retransmission, session timers). Never raises."""
        try:
            self._core.fire_transaction_timers(now)
            for call in list(self._core.calls.values()):
                self._call_timers(call, now)
            self.registrations.fire_timers(now)
        except Exception:
            self._core.stats.internal_errors += 1

    def next_deadline(self) -> float | None:
        first = self._core.next_deadline()
        if not self.registrations.clients:  # the common case: asked after every message the transport feeds in
            return first
        registration = self.registrations.next_deadline()
        return registration if first is None or (registration is not None and registration < first) else first

    def transport_failed(self, outgoing: Outgoing, now: float, *, cause: str, detail: str) -> None:
        """The glue could not deliver ``outgoing`` (``cause``: connect, tls, resolve, ...; ``detail``: how).
        Client transactions toward its destination end as if 503 had come; an outbound call's failure names the
        cause. Never raises."""
        try:
            self._core.transport_failed(outgoing.destination, outgoing.transport, now, cause=cause, detail=detail)
        except Exception as exc:
            self._core.stats.internal_errors += 1
            self.last_internal_error = exc

    def flow_in_use(self, transport: str, address: Address) -> bool:
        """True while a live call's dialog uses the connection to ``address`` (the glue keeps it open)."""
        return self._core.flow_in_use(transport, address)

    def transport_of(self, call: CallHandle) -> str | None:
        """The SIP transport a call's INVITE came or went over (udp, tcp, tls); None for an unknown call."""
        c = self._core.calls.get(call)
        return c.transport if c is not None else None

    def peer_allows(self, call: CallHandle, method: str) -> bool:
        """The peer's Allow header (from its INVITE or its 2xx) lists ``method``; False for an unknown call."""
        c = self._core.calls.get(call)
        return c is not None and method.lower() in c.peer_allow

    def datagrams(self) -> list[Outgoing]:
        out, self._core.outbox = self._core.outbox, []
        return out

    def events(self) -> list[SipEvent]:
        out, self._core.pending_events = self._core.pending_events, []
        return out

    # --- incoming calls --------------------------------------------------------------------------

    def ring(self, call: CallHandle, now: float, *, status: int = 180, body: bytes = b"") -> None:
        """Send a provisional response (180 Ringing, or 183 with early-media SDP): :func:`.early_media.check_early`
        states the rules a body must meet (an answer to the INVITE's offer, the same every time and in the 2xx)."""
        c = self._offered(call)
        if c is None:
            return
        if not 101 <= status <= 199:
            raise LocalProtocolError("ring() needs a 1xx status above 100")
        if body:
            c.early_body = check_early(c.invite, c.early_body, body)
        contact = self._core.contact(c.transport, secure=c.secure)
        headers = (("Contact", contact), *_body_headers(body, "application/sdp"))
        assert c.invite_tx is not None
        if c.reliable is not None:
            send_provisional(self._core, c, status, headers, body, now)
            return
        self._core.respond(c.invite_tx, status, now, to_tag=c.local_tag, headers=headers, body=body)

    def answer(
        self,
        call: CallHandle,
        now: float,
        *,
        body: bytes,
        status: int = 200,
        content_type: str = "application/sdp",
        headers: Headers = (),
    ) -> None:
        """Accept an offered call with a 2xx (retransmitted until the ACK, §13.3.1.4)."""
        c = self._offered(call)
        if c is None:
            return
        if not 200 <= status <= 299:
            raise LocalProtocolError("answer() needs a 2xx status")
        check_final(c.early_body, body)
        tx = c.invite_tx
        assert tx is not None

        def send(at: float) -> None:
            self._send_ok(c, tx.request, tx, status, body, content_type, headers, at)

        hold_final(c, True, send, now)  # waits for the PRACK of a reliable 183 with SDP (RFC 3262 §3)
        c.state = CallState.ANSWERED

    def reject(
        self, call: CallHandle, now: float, *, status: int = 486, reason: str | None = None, headers: Headers = ()
    ) -> None:
        """Refuse an offered call with a 3xx-6xx (the transaction retransmits it until the ACK)."""
        c = self._offered(call)
        if c is None:
            return
        if not 300 <= status <= 699:
            raise LocalProtocolError("reject() needs a 3xx-6xx status")
        assert c.invite_tx is not None
        self._core.respond(c.invite_tx, status, now, reason=reason, to_tag=c.local_tag, headers=tuple(headers))
        self._core.end_call(c, reason=reason or "rejected", by="local", status=status)

    # --- any call --------------------------------------------------------------------------------

    def hang_up(
        self,
        call: CallHandle,
        now: float,
        *,
        reason: str = "normal clearing",
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """End the call in whatever state it is: 480 if unanswered, CANCEL if calling, else BYE.

        ``headers`` go on the BYE (an RFC 3326 ``Reason``, say). Idempotent: an unknown or ended call is
        ignored. CallEnded(by="local") is emitted at once."""
        c = self._core.calls.get(call)
        if c is None or c.end_reported:
            return
        c.bye_headers = headers
        if c.state is CallState.OFFERED:
            self.reject(call, now, status=480, reason=reason)  # Temporarily Unavailable
            return
        if c.state is CallState.CALLING:
            c.cancel_wanted = True
            if c.provisional_seen:
                send_cancel(self._core, c, now)
        elif c.state is CallState.ANSWERED:
            c.bye_pending = reason  # §15: the BYE waits for the ACK (or its timeout)
        elif c.state is CallState.CONFIRMED:
            send_bye(self._core, c, now)
        self._core.end_call(c, reason=reason, by="local")

    def reinvite(self, call: CallHandle, now: float, *, body: bytes, content_type: str = "application/sdp") -> None:
        """Send a re-INVITE with a new offer (hold: a=sendonly / inactive; unhold: sendrecv)."""
        c = self._confirmed(call)
        if c is not None:
            self._start_update(c, "INVITE", body, content_type, now, refresh=False)

    def update(
        self, call: CallHandle, now: float, *, body: bytes | None = None, content_type: str = "application/sdp"
    ) -> None:
        """Send an UPDATE (RFC 3311), with a new offer or none (a plain session refresh)."""
        c = self._confirmed(call)
        if c is not None:
            self._start_update(c, "UPDATE", body or b"", content_type, now, refresh=False)

    def answer_reinvite(
        self, call: CallHandle, now: float, *, body: bytes, status: int = 200, content_type: str = "application/sdp"
    ) -> None:
        """Answer the pending ReinviteReceived with a 2xx carrying our SDP answer (or offer)."""
        c = self._confirmed(call)
        if c is None:
            return
        tx = c.incoming_update_tx
        if tx is None:
            raise LocalProtocolError("no re-INVITE or UPDATE is pending")
        c.incoming_update_tx = None
        self._send_ok(c, tx.request, tx, status, body, content_type, (), now)
        if c.dialog is not None:
            c.dialog.refresh_target(tx.request)
        if c.session_timer is not None:
            c.session_timer.refreshed(now)
            self._core.emit(SessionRefreshed(call=c.handle, interval=c.session_timer.interval, by="remote"))

    def reject_reinvite(self, call: CallHandle, now: float, *, status: int = 488, reason: str | None = None) -> None:
        """Refuse the pending re-INVITE/UPDATE; the session goes on as it was (§14.2)."""
        c = self._confirmed(call)
        if c is None:
            return
        tx = c.incoming_update_tx
        if tx is None:
            raise LocalProtocolError("no re-INVITE or UPDATE is pending")
        c.incoming_update_tx = None
        self._core.respond(tx, status, now, reason=reason)

    def refer(self, call: CallHandle, now: float, *, target_uri: str) -> None:
        """Blind transfer (RFC 3515): REFER the peer to `target_uri`; progress comes as Transfer* events."""
        c = self._confirmed(call)
        if c is None:
            return
        target = _parse_local_uri(target_uri)
        c.refer_pending = True
        assert c.dialog is not None
        refer_to = (("Refer-To", f"<{target}>"), ("Referred-By", f"<{c.dialog.local_uri.uri}>"))
        send_in_dialog(self._core, c, "REFER", now, headers=refer_to)

    def replaces_target(self, call: CallHandle) -> str | None:
        """The Refer-To URI that sends another peer to this call's far end, replacing this dialog (RFC 3891,
        gateway/sip/replaces.py); None once it ended, LocalProtocolError before it is established."""
        c = self._confirmed(call)
        if c is None or c.dialog is None:
            return None
        d = c.dialog
        return refer_to_replacing(str(d.remote_target), d.call_id, local_tag=d.local_tag, remote_tag=d.remote_tag)

    def accept_refer(self, call: CallHandle, now: float) -> None:
        """Take the pending ReferReceived: 202 Accepted and NOTIFY "100 Trying" (gateway/sip/refer_sub.py)."""
        self._refer_in(call, now, lambda sub: sub.accept())

    def decline_refer(self, call: CallHandle, now: float, *, status: int = 603, reason: str | None = None) -> None:
        """Refuse the pending ReferReceived (603 Decline: outside policy); the call goes on."""
        self._refer_in(call, now, lambda sub: sub.decline(status, reason))

    def notify_refer(self, call: CallHandle, now: float, *, status: int, reason: str) -> None:
        """NOTIFY the referrer of the new call's `status` (a final one terminates the subscription)."""
        self._refer_in(call, now, lambda sub: sub.progress(status, reason))

    def _refer_in(self, call: CallHandle, now: float, step: Callable[[ReferSubscription], ReferAction]) -> None:
        c = self._core.calls.get(call)  # an ended call may still owe its REFER an answer
        if c is None or c.refer_in is None:
            raise LocalProtocolError(f"call {call} has no incoming REFER")
        send_refer_action(self._core, c, step(c.refer_in), now)

    def send_dtmf_info(self, call: CallHandle, now: float, *, digit: str, duration_ms: int = 160) -> None:
        """Send one digit as INFO application/dtmf-relay (for peers without RFC 4733)."""
        c = self._confirmed(call)
        if c is None:
            return
        if len(digit) != 1 or digit.upper() not in "0123456789*#ABCD":
            raise LocalProtocolError(f"not a DTMF digit: {digit!r}")
        body = f"Signal={digit.upper()}\r\nDuration={duration_ms}\r\n".encode()
        send_in_dialog(self._core, c, "INFO", now, body=body, content_type="application/dtmf-relay")

    # --- outgoing --------------------------------------------------------------------------------

    def invite(
        self,
        request_uri: str,
        now: float,
        *,
        from_uri: str,
        body: bytes,
        to_uri: str | None = None,
        content_type: str = "application/sdp",
        headers: Headers = (),
        credentials: ClientCredentials | None = None,
        outbound_proxy: ProxyChoice = CONFIGURED_PROXY,
    ) -> CallHandle:
        """Place a call. A 401/407 is answered once with `credentials`; events report progress. A trunk's own
        `outbound_proxy` (or None: none) replaces the configured one."""
        core = self._core
        uri = _parse_local_uri(request_uri)
        sender = _parse_local_addr(from_uri)
        recipient = _parse_local_addr(to_uri or request_uri)
        destination, transport, route = core.out_of_dialog_hop(uri, outbound_proxy)
        secure = uri.scheme == "sips"
        local_tag = core.token(32)
        invite = SipRequest(method="INVITE", uri=uri, body=body)
        for name, value in (
            ("Via", core.via(transport)),
            *route,
            ("Max-Forwards", "70"),
            ("From", f"{sender.with_params(())};tag={local_tag}"),
            ("To", str(recipient.with_params(()))),
            ("Call-ID", f"{core.token(96)}@{core.config.via_host}"),
            ("CSeq", "1 INVITE"),
            ("Contact", core.contact(transport, secure=secure)),
            *core.common_headers(),
            *offer_headers(core.config.session_timer),
            *_body_headers(body, content_type),
            *headers,
        ):
            invite.headers.add(name, value)
        call = Call(
            handle=core.new_handle(),
            role="uac",
            state=CallState.CALLING,
            transport=transport,
            peer=destination,
            secure=secure,
            invite=invite,
            local_tag=local_tag,
            local_body=body,
            local_content_type=content_type,
            credentials=credentials,
        )
        core.add_call(call)
        start_invite(core, call, now)
        return call.handle

    def send_options(self, target_uri: str, now: float) -> str:
        """An out-of-dialog OPTIONS (a health ping); the answer comes as OptionsAnswered(request_id)."""
        core = self._core
        uri = _parse_local_uri(target_uri)
        destination, transport = core.uri_destination(uri)
        request = SipRequest(method="OPTIONS", uri=uri)
        request_id = f"options-{core.token(32)}"
        for name, value in (
            ("Via", core.via(transport)),
            ("Max-Forwards", "70"),
            ("From", f"<sip:{core.config.contact_user}@{core.config.via_host}>;tag={core.token(32)}"),
            ("To", f"<{uri}>"),
            ("Call-ID", f"{core.token(96)}@{core.config.via_host}"),
            ("CSeq", "1 OPTIONS"),
            *core.common_headers(),
        ):
            request.headers.add(name, value)
        core.start_client(request, destination, transport, now, context=OptionsPing(request_id=request_id))
        return request_id

    # --- internals -------------------------------------------------------------------------------

    def _on_client_response(self, tx: Transaction, response: SipResponse | None, now: float) -> None:
        if not self.registrations.on_response(tx, response, now):
            on_response(self._core, tx, response, now)

    def _receive(self, data: bytes, source: Address, transport: str, now: float) -> None:
        core = self._core
        try:
            message = parse_message(data, limits=self.config.limits, framed=transport != "udp")
        except MalformedMessageError as exc:
            partial = exc.partial
            if isinstance(partial, SipRequest) and partial.method != "ACK" and can_answer(partial):
                self._answer_error(partial, exc, source, transport)
            else:
                core.stats.malformed_dropped += 1
            return
        if isinstance(message, SipResponse):
            self._on_response(message, now)
            return
        core.stats.requests_received += 1
        if not can_answer(message):
            core.stats.malformed_dropped += 1
            return
        _stamp_via(message, source)
        try:
            validate_request(message)
            if message.uri.scheme not in ACCEPTED_REQUEST_SCHEMES:
                raise RemoteProtocolError(f"unsupported URI scheme {message.uri.scheme}", status_code=416)
            if message.uri.scheme == "sips" and transport != "tls":
                raise RemoteProtocolError("SIPS Request-URI needs TLS", status_code=416)
            max_forwards = message.headers.get("Max-Forwards")
            if max_forwards is not None and int(max_forwards) == 0 and message.method not in ("ACK", "OPTIONS"):
                raise RemoteProtocolError("Too Many Hops", status_code=483)
        except RemoteProtocolError as exc:
            if message.method != "ACK":
                self._answer_error(message, exc, source, transport)
            else:
                core.stats.malformed_dropped += 1
            return
        decision = self._policy.check(message, source, now, transport=transport)
        if decision.events:
            core.pending_events.extend(decision.events)
            for event in decision.events:
                if isinstance(event, AuthenticationFailed):
                    core.stats.auth_failed += 1
                elif isinstance(event, SourceBlocked):
                    core.stats.sources_blocked += 1
        if decision.verdict is Verdict.DROP:
            counter = decision.counter or "policy_dropped"
            setattr(core.stats, counter, getattr(core.stats, counter) + 1)
            return
        if decision.verdict is not Verdict.ALLOW:
            if decision.verdict is Verdict.CHALLENGE:
                core.stats.auth_challenged += 1
            else:
                core.stats.policy_rejected += 1
            core.reply_stateless(message, decision.status, source, transport, headers=decision.headers)
            return
        handle_request(core, message, source, transport, now)

    def _answer_error(self, request: SipRequest, exc: RemoteProtocolError, source: Address, transport: str) -> None:
        self._core.stats.malformed_answered += 1
        with contextlib.suppress(RemoteProtocolError):  # answer even if the Via cannot take received=
            _stamp_via(request, source)
        self._core.reply_stateless(
            request, exc.status_code, source, transport, reason=exc.reason[:100], headers=exc.headers
        )

    def _on_response(self, response: SipResponse, now: float) -> None:
        core = self._core
        core.stats.responses_received += 1
        vias = response.vias
        if len(vias) != 1:
            core.stats.unmatched_responses += 1  # §8.1.3.3: more than one Via means it was not for us
            return
        cseq = response.cseq
        tx = core.client_txs.get((vias[0].branch or "", cseq.method))
        if tx is not None:
            core.apply(tx, tx.receive_response(response, now), now)
            return
        if cseq.method == "INVITE" and 200 <= response.status < 300:
            call = core.call_for_dialog((response.call_id, response.from_.tag or "", response.to.tag or ""))
            if call is not None and call.ack is not None and call.dialog is not None:
                core.send_in_dialog(call, call.ack.encode())
                return
        core.stats.unmatched_responses += 1

    def _call_timers(self, call: Call, now: float) -> None:
        core = self._core
        if fire_prack(core, call, now):
            return
        if call.ok_give_up is not None and call.ok_give_up <= now:
            # §13.3.1.4: no ACK for our 2xx within 64*T1: confirm and end the session with BYE.
            call.ok_response = None
            call.ok_next = call.ok_give_up = None
            reason = call.bye_pending or "no ACK"
            call.bye_pending = None
            call.state = CallState.CONFIRMED
            send_bye(core, call, now)
            core.end_call(call, reason=reason, by="local", status=408)
            return
        if call.ok_next is not None and call.ok_next <= now and call.ok_response is not None:
            destination = call.ok_destination or call.peer
            core.send(call.ok_response.encode(), destination, call.transport)
            core.stats.retransmissions_sent += 1
            call.ok_interval = min(2 * call.ok_interval, self.config.timers.t2)
            call.ok_next = now + call.ok_interval
        timer = call.session_timer
        if timer is None or call.state is not CallState.CONFIRMED or timer.deadline > now:
            return
        if timer.we_refresh and not timer.refresh_sent:
            if call.outgoing_update_tx is None and call.incoming_update_tx is None:
                method = "UPDATE" if "update" in call.peer_allow else "INVITE"
                body = b"" if method == "UPDATE" else call.local_body
                self._start_update(call, method, body, call.local_content_type, now, refresh=True)
            timer.refresh_sent = True
            return
        # RFC 4028 §10: no refresh arrived in time.
        send_bye(core, call, now)
        core.end_call(call, reason="session expired", by="local", status=408)

    def _start_update(
        self, call: Call, method: str, body: bytes, content_type: str, now: float, *, refresh: bool
    ) -> None:
        if call.outgoing_update_tx is not None or call.incoming_update_tx is not None:
            if refresh:
                return
            self._core.emit(ReinviteFailed(call=call.handle, method=method, status=491, reason="Request Pending"))
            return
        headers = refresh_headers(call.session_timer) if call.session_timer is not None else ()
        if body:
            call.local_body, call.local_content_type = body, content_type
        call.refresh_in_flight = refresh
        call.outgoing_update_tx = send_in_dialog(
            self._core, call, method, now, body=body, content_type=content_type, headers=headers
        )

    def _send_ok(
        self,
        call: Call,
        request: SipRequest,
        tx: Transaction,
        status: int,
        body: bytes,
        content_type: str,
        headers: Headers,
        now: float,
    ) -> None:
        core = self._core
        all_headers = (
            ("Contact", core.contact(call.transport, secure=call.secure)),
            *core.common_headers(response=True),
            *call.answer_headers,
            *_body_headers(body, content_type),
            *headers,
        )
        response = core.respond(tx, status, now, to_tag=call.local_tag, headers=all_headers, body=body)
        call.local_body, call.local_content_type = body, content_type
        if request.method == "INVITE":
            call.ok_response = response
            call.ok_destination = tx.peer
            call.ok_interval = self.config.timers.t1
            call.ok_next = now + call.ok_interval
            call.ok_give_up = now + 64 * self.config.timers.t1

    def _live(self, call: CallHandle) -> Call | None:
        """The call, or None once it has ended: acting on an ended call is a race, not an error."""
        c = self._core.calls.get(call)
        return None if c is None or c.end_reported else c

    def _offered(self, call: CallHandle) -> Call | None:
        c = self._live(call)
        if c is not None and (c.state is not CallState.OFFERED or c.invite_tx is None):
            raise LocalProtocolError(f"call {call} is not an offered incoming call (state {c.state.value})")
        return c

    def _confirmed(self, call: CallHandle) -> Call | None:
        c = self._live(call)
        if c is not None and (c.state is not CallState.CONFIRMED or c.dialog is None):
            raise LocalProtocolError(f"call {call} is not established (state {c.state.value})")
        return c


def _stamp_via(request: SipRequest, source: Address) -> None:
    """§18.2.1 and RFC 3581 §4: received= when the source differs (or rport asked), rport=<port>.

    A received= the sender wrote itself is never trusted: it would steer our answer to any address."""
    values = request.headers.values("Via")
    top = parse_via(values[0])
    if top.sent_by[0] == source[0].lower() and not top.has_rport and top.received is None:
        return
    top = top.with_param("received", source[0])
    if top.has_rport:
        top = top.with_param("rport", str(source[1]))
    request.headers.set("Via", ", ".join([str(top), *values[1:]]))


def _body_headers(body: bytes, content_type: str) -> tuple[tuple[str, str], ...]:
    return (("Content-Type", content_type),) if body else ()


def _parse_local_uri(text: str) -> SipUri:
    try:
        return parse_uri(text)
    except RemoteProtocolError as exc:
        raise LocalProtocolError(f"bad URI {text!r}: {exc.reason}") from exc


def _parse_local_addr(text: str) -> NameAddr:
    # A bare URI is wrapped so its ;parameters stay URI parameters (§20.10 would make them header ones).
    try:
        return parse_name_addr(text if "<" in text else f"<{text}>")
    except RemoteProtocolError as exc:
        raise LocalProtocolError(f"bad address {text!r}: {exc.reason}") from exc
