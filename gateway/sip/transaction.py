"""SIP transactions (RFC 3261 §17, with the Accepted states of RFC 6026) as state tables.

Rules, one table per kind, keyed on (state, input) -> (next state, actions):

INVITE client (§17.1.1, RFC 6026 §7.2)      starts in CALLING: send request, arm A (unreliable), B
    CALLING     timer A      -> CALLING      resend request, re-arm A at 2x (uncapped)
    CALLING     timer B      -> TERMINATED   report timeout (408 to the TU)
    CALLING|PROCEEDING  1xx  -> PROCEEDING   pass to TU (A stops: it lives in CALLING only)
    CALLING|PROCEEDING  2xx  -> ACCEPTED     pass to TU, arm M (the TU/dialog sends the ACK for a 2xx)
    CALLING|PROCEEDING  3-6xx-> COMPLETED    send ACK (built here, same branch), pass to TU, arm D
    COMPLETED   3-6xx        -> COMPLETED    resend ACK
    COMPLETED   timer D      -> TERMINATED
    ACCEPTED    2xx          -> ACCEPTED     pass to TU (2xx retransmission: the dialog re-sends its ACK)
    ACCEPTED    timer M      -> TERMINATED
    CALLING|PROCEEDING transport error -> TERMINATED  report it (the TU acts as if 503 came, §8.1.3.1)
    COMPLETED   transport error -> TERMINATED   (the ACK of a 3xx-6xx could not go; nothing is left to do)
non-INVITE client (§17.1.2)                  starts in TRYING: send request, arm E (unreliable), F
    TRYING      timer E      -> TRYING       resend, re-arm E at min(2x, T2)
    TRYING|PROCEEDING 1xx    -> PROCEEDING   pass to TU
    PROCEEDING  timer E      -> PROCEEDING   resend, re-arm E at T2
    TRYING|PROCEEDING final  -> COMPLETED    pass to TU, arm K (0 on reliable transports)
    TRYING|PROCEEDING timer F-> TERMINATED   report timeout
    COMPLETED   timer K      -> TERMINATED
    TRYING|PROCEEDING transport error -> TERMINATED  report it (§17.1.2.2)
INVITE server (§17.2.1, RFC 6026 §7.1)       starts in PROCEEDING (the core sends 100 Trying at once)
    PROCEEDING  request      -> PROCEEDING   resend the last provisional response
    PROCEEDING  TU 1xx       -> PROCEEDING   send it
    PROCEEDING  TU 2xx       -> ACCEPTED     send it, arm L (the core retransmits the 2xx until ACK, §13.3.1.4)
    PROCEEDING  TU 3-6xx     -> COMPLETED    send it, arm G (unreliable), H
    ACCEPTED    request      -> ACCEPTED     absorb
    ACCEPTED    TU 2xx       -> ACCEPTED     send it (core retransmission)
    ACCEPTED    timer L      -> TERMINATED
    COMPLETED   request      -> COMPLETED    resend the final response
    COMPLETED   timer G      -> COMPLETED    resend, re-arm G at min(2x, T2)
    COMPLETED   ACK          -> CONFIRMED    arm I (0 on reliable transports)
    COMPLETED   timer H      -> TERMINATED   report timeout (no ACK)
    CONFIRMED   ACK          -> CONFIRMED    absorb
    CONFIRMED   timer I      -> TERMINATED
non-INVITE server (§17.2.2)                  starts in TRYING
    TRYING      request      -> TRYING       absorb
    TRYING|PROCEEDING TU 1xx -> PROCEEDING   send it
    PROCEEDING  request      -> PROCEEDING   resend the provisional
    TRYING|PROCEEDING TU final -> COMPLETED  send it, arm J (0 on reliable transports)
    COMPLETED   request      -> COMPLETED    resend the final response
    COMPLETED   timer J      -> TERMINATED
Any (state, input) pair not in a table is ignored. A transport error reaches client transactions only: the
glue reports a destination it could not connect to (or finish a TLS handshake with); a response that cannot
be delivered leaves its server transaction to its own timers. A timer lives only in the states listed in `_LIVE_TIMERS`:
leaving those states disarms it. Transaction keys follow §17.1.3 (client: branch + CSeq method) and
§17.2.3 (server: branch + sent-by + method, ACK matching INVITE).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .headers import BRANCH_MAGIC
from .message import SipRequest, SipResponse
from .timers import SipTimers


class TxKind(enum.Enum):
    INVITE_CLIENT = "invite-client"
    NON_INVITE_CLIENT = "non-invite-client"
    INVITE_SERVER = "invite-server"
    NON_INVITE_SERVER = "non-invite-server"


class TxState(enum.Enum):
    CALLING = "Calling"
    TRYING = "Trying"
    PROCEEDING = "Proceeding"
    ACCEPTED = "Accepted"
    COMPLETED = "Completed"
    CONFIRMED = "Confirmed"
    TERMINATED = "Terminated"


class TxInput(enum.Enum):
    REQUEST = "request retransmission"
    ACK = "ACK"
    TU_1XX = "TU 1xx"
    TU_2XX = "TU 2xx"
    TU_FINAL = "TU 3xx-6xx"
    RESPONSE_1XX = "1xx"
    RESPONSE_2XX = "2xx"
    RESPONSE_FINAL = "3xx-6xx"
    TIMER_A = "A"
    TIMER_B = "B"
    TIMER_D = "D"
    TIMER_E = "E"
    TIMER_F = "F"
    TIMER_G = "G"
    TIMER_H = "H"
    TIMER_I = "I"
    TIMER_J = "J"
    TIMER_K = "K"
    TIMER_L = "L"
    TIMER_M = "M"
    TRANSPORT_ERROR = "transport error"


class TxAction(enum.Enum):
    SEND_REQUEST = "send request"
    SEND_RESPONSE = "send response"
    SEND_ACK = "send ACK"
    PASS_RESPONSE = "pass response to TU"
    REPORT_TIMEOUT = "report timeout"
    REPORT_TRANSPORT_ERROR = "report transport error"
    ARM_A = "arm A"
    ARM_B = "arm B"
    ARM_D = "arm D"
    ARM_E = "arm E"
    ARM_E_T2 = "arm E at T2"
    ARM_F = "arm F"
    ARM_G = "arm G"
    ARM_H = "arm H"
    ARM_I = "arm I"
    ARM_J = "arm J"
    ARM_K = "arm K"
    ARM_L = "arm L"
    ARM_M = "arm M"


S, I, A = TxState, TxInput, TxAction  # noqa: E741 — short names keep the tables readable
Table = dict[tuple[TxState, TxInput], tuple[TxState, tuple[TxAction, ...]]]

INVITE_CLIENT_TABLE: Table = {
    (S.CALLING, I.TIMER_A): (S.CALLING, (A.SEND_REQUEST, A.ARM_A)),
    (S.CALLING, I.TIMER_B): (S.TERMINATED, (A.REPORT_TIMEOUT,)),
    (S.CALLING, I.RESPONSE_1XX): (S.PROCEEDING, (A.PASS_RESPONSE,)),
    (S.PROCEEDING, I.RESPONSE_1XX): (S.PROCEEDING, (A.PASS_RESPONSE,)),
    (S.CALLING, I.RESPONSE_2XX): (S.ACCEPTED, (A.PASS_RESPONSE, A.ARM_M)),
    (S.PROCEEDING, I.RESPONSE_2XX): (S.ACCEPTED, (A.PASS_RESPONSE, A.ARM_M)),
    (S.CALLING, I.RESPONSE_FINAL): (S.COMPLETED, (A.SEND_ACK, A.PASS_RESPONSE, A.ARM_D)),
    (S.PROCEEDING, I.RESPONSE_FINAL): (S.COMPLETED, (A.SEND_ACK, A.PASS_RESPONSE, A.ARM_D)),
    (S.COMPLETED, I.RESPONSE_FINAL): (S.COMPLETED, (A.SEND_ACK,)),
    (S.COMPLETED, I.TIMER_D): (S.TERMINATED, ()),
    (S.ACCEPTED, I.RESPONSE_2XX): (S.ACCEPTED, (A.PASS_RESPONSE,)),
    (S.ACCEPTED, I.TIMER_M): (S.TERMINATED, ()),
    (S.CALLING, I.TRANSPORT_ERROR): (S.TERMINATED, (A.REPORT_TRANSPORT_ERROR,)),
    (S.PROCEEDING, I.TRANSPORT_ERROR): (S.TERMINATED, (A.REPORT_TRANSPORT_ERROR,)),
    (S.COMPLETED, I.TRANSPORT_ERROR): (S.TERMINATED, ()),
}

NON_INVITE_CLIENT_TABLE: Table = {
    (S.TRYING, I.TIMER_E): (S.TRYING, (A.SEND_REQUEST, A.ARM_E)),
    (S.TRYING, I.TIMER_F): (S.TERMINATED, (A.REPORT_TIMEOUT,)),
    (S.TRYING, I.RESPONSE_1XX): (S.PROCEEDING, (A.PASS_RESPONSE,)),
    (S.PROCEEDING, I.RESPONSE_1XX): (S.PROCEEDING, (A.PASS_RESPONSE,)),
    (S.PROCEEDING, I.TIMER_E): (S.PROCEEDING, (A.SEND_REQUEST, A.ARM_E_T2)),
    (S.PROCEEDING, I.TIMER_F): (S.TERMINATED, (A.REPORT_TIMEOUT,)),
    (S.TRYING, I.RESPONSE_2XX): (S.COMPLETED, (A.PASS_RESPONSE, A.ARM_K)),
    (S.TRYING, I.RESPONSE_FINAL): (S.COMPLETED, (A.PASS_RESPONSE, A.ARM_K)),
    (S.PROCEEDING, I.RESPONSE_2XX): (S.COMPLETED, (A.PASS_RESPONSE, A.ARM_K)),
    (S.PROCEEDING, I.RESPONSE_FINAL): (S.COMPLETED, (A.PASS_RESPONSE, A.ARM_K)),
    (S.COMPLETED, I.TIMER_K): (S.TERMINATED, ()),
    (S.TRYING, I.TRANSPORT_ERROR): (S.TERMINATED, (A.REPORT_TRANSPORT_ERROR,)),
    (S.PROCEEDING, I.TRANSPORT_ERROR): (S.TERMINATED, (A.REPORT_TRANSPORT_ERROR,)),
}

INVITE_SERVER_TABLE: Table = {
    (S.PROCEEDING, I.REQUEST): (S.PROCEEDING, (A.SEND_RESPONSE,)),
    (S.PROCEEDING, I.TU_1XX): (S.PROCEEDING, (A.SEND_RESPONSE,)),
    (S.PROCEEDING, I.TU_2XX): (S.ACCEPTED, (A.SEND_RESPONSE, A.ARM_L)),
    (S.PROCEEDING, I.TU_FINAL): (S.COMPLETED, (A.SEND_RESPONSE, A.ARM_G, A.ARM_H)),
    (S.ACCEPTED, I.REQUEST): (S.ACCEPTED, ()),
    (S.ACCEPTED, I.TU_2XX): (S.ACCEPTED, (A.SEND_RESPONSE,)),
    (S.ACCEPTED, I.TIMER_L): (S.TERMINATED, ()),
    (S.COMPLETED, I.REQUEST): (S.COMPLETED, (A.SEND_RESPONSE,)),
    (S.COMPLETED, I.TIMER_G): (S.COMPLETED, (A.SEND_RESPONSE, A.ARM_G)),
    (S.COMPLETED, I.ACK): (S.CONFIRMED, (A.ARM_I,)),
    (S.COMPLETED, I.TIMER_H): (S.TERMINATED, (A.REPORT_TIMEOUT,)),
    (S.CONFIRMED, I.ACK): (S.CONFIRMED, ()),
    (S.CONFIRMED, I.TIMER_I): (S.TERMINATED, ()),
}

NON_INVITE_SERVER_TABLE: Table = {
    (S.TRYING, I.REQUEST): (S.TRYING, ()),
    (S.TRYING, I.TU_1XX): (S.PROCEEDING, (A.SEND_RESPONSE,)),
    (S.PROCEEDING, I.TU_1XX): (S.PROCEEDING, (A.SEND_RESPONSE,)),
    (S.PROCEEDING, I.REQUEST): (S.PROCEEDING, (A.SEND_RESPONSE,)),
    (S.TRYING, I.TU_2XX): (S.COMPLETED, (A.SEND_RESPONSE, A.ARM_J)),
    (S.TRYING, I.TU_FINAL): (S.COMPLETED, (A.SEND_RESPONSE, A.ARM_J)),
    (S.PROCEEDING, I.TU_2XX): (S.COMPLETED, (A.SEND_RESPONSE, A.ARM_J)),
    (S.PROCEEDING, I.TU_FINAL): (S.COMPLETED, (A.SEND_RESPONSE, A.ARM_J)),
    (S.COMPLETED, I.REQUEST): (S.COMPLETED, (A.SEND_RESPONSE,)),
    (S.COMPLETED, I.TIMER_J): (S.TERMINATED, ()),
}

TABLES: dict[TxKind, Table] = {
    TxKind.INVITE_CLIENT: INVITE_CLIENT_TABLE,
    TxKind.NON_INVITE_CLIENT: NON_INVITE_CLIENT_TABLE,
    TxKind.INVITE_SERVER: INVITE_SERVER_TABLE,
    TxKind.NON_INVITE_SERVER: NON_INVITE_SERVER_TABLE,
}

INITIAL_STATE: dict[TxKind, TxState] = {
    TxKind.INVITE_CLIENT: S.CALLING,
    TxKind.NON_INVITE_CLIENT: S.TRYING,
    TxKind.INVITE_SERVER: S.PROCEEDING,
    TxKind.NON_INVITE_SERVER: S.TRYING,
}

INITIAL_ACTIONS: dict[TxKind, tuple[TxAction, ...]] = {
    TxKind.INVITE_CLIENT: (A.SEND_REQUEST, A.ARM_A, A.ARM_B),
    TxKind.NON_INVITE_CLIENT: (A.SEND_REQUEST, A.ARM_E, A.ARM_F),
    TxKind.INVITE_SERVER: (),
    TxKind.NON_INVITE_SERVER: (),
}

# Each timer is alive only in these states; a transition elsewhere disarms it.
_LIVE_TIMERS: dict[TxInput, frozenset[TxState]] = {
    I.TIMER_A: frozenset({S.CALLING}),
    I.TIMER_B: frozenset({S.CALLING}),
    I.TIMER_D: frozenset({S.COMPLETED}),
    I.TIMER_E: frozenset({S.TRYING, S.PROCEEDING}),
    I.TIMER_F: frozenset({S.TRYING, S.PROCEEDING}),
    I.TIMER_G: frozenset({S.COMPLETED}),
    I.TIMER_H: frozenset({S.COMPLETED}),
    I.TIMER_I: frozenset({S.CONFIRMED}),
    I.TIMER_J: frozenset({S.COMPLETED}),
    I.TIMER_K: frozenset({S.COMPLETED}),
    I.TIMER_L: frozenset({S.ACCEPTED}),
    I.TIMER_M: frozenset({S.ACCEPTED}),
}

_ARMS: dict[TxAction, TxInput] = {
    A.ARM_A: I.TIMER_A,
    A.ARM_B: I.TIMER_B,
    A.ARM_D: I.TIMER_D,
    A.ARM_E: I.TIMER_E,
    A.ARM_E_T2: I.TIMER_E,
    A.ARM_F: I.TIMER_F,
    A.ARM_G: I.TIMER_G,
    A.ARM_H: I.TIMER_H,
    A.ARM_I: I.TIMER_I,
    A.ARM_J: I.TIMER_J,
    A.ARM_K: I.TIMER_K,
    A.ARM_L: I.TIMER_L,
    A.ARM_M: I.TIMER_M,
}
_RETRANSMIT_TIMERS = frozenset({I.TIMER_A, I.TIMER_E, I.TIMER_G})


@dataclass(frozen=True, kw_only=True)
class Transmit:
    """Send these bytes to the transaction's peer address."""

    data: bytes


@dataclass(frozen=True, kw_only=True)
class ResponsePassed:
    """A response the client transaction hands to the TU."""

    response: SipResponse


@dataclass(frozen=True, kw_only=True)
class TransactionTimedOut:
    """Timer B/F (client: act as if 408 arrived) or H (server: the ACK never came)."""


@dataclass(frozen=True, kw_only=True)
class TransportErrorReported:
    """The request could not be delivered (client transactions): ``cause`` names what failed (connect, tls,
    resolve, ...), ``detail`` says how, for the call's record and the logs."""

    cause: str
    detail: str


TxEffect = Transmit | ResponsePassed | TransactionTimedOut | TransportErrorReported
Address = tuple[str, int]


def server_key(request: SipRequest) -> tuple[str, ...]:
    """§17.2.3: branch + sent-by + method (ACK and CANCEL are matched by the caller as needed)."""
    via = request.top_via
    method = "INVITE" if request.method == "ACK" else request.method
    branch = via.branch or ""
    host, port = via.sent_by
    if branch.startswith(BRANCH_MAGIC):
        return (branch, host, str(port), method)
    # RFC 2543 peers: no magic cookie; fall back to the dialog-ish identity of §17.2.3's second half.
    to_tag = request.to.tag or "" if request.method != "ACK" else ""
    return ("2543", request.call_id, request.from_.tag or "", to_tag, str(request.cseq.number), host, method)


def client_key(branch: str, method: str) -> tuple[str, ...]:
    """§17.1.3: a response matches by the top Via branch and the CSeq method."""
    return (branch, method)


@dataclass(kw_only=True)
class Transaction:
    """One transaction. Feed inputs with `handle`; it returns effects; TERMINATED means drop it."""

    kind: TxKind
    request: SipRequest
    peer: Address  # client: where requests go; server: where responses go (§18.2.2)
    transport: str
    timers: SipTimers
    state: TxState = S.TRYING
    last_response: SipResponse | None = None
    ack: SipRequest | None = None
    received: SipResponse | None = None  # client: the response being processed
    deadlines: dict[TxInput, float] = field(default_factory=dict)
    intervals: dict[TxInput, float] = field(default_factory=dict)
    # Caller-owned context (for example the call handle the transaction belongs to).
    context: object = None
    # Client: the connection to send on while it is open (a dialog's), else a new one to `peer`.
    flow: Address | None = None
    transport_failure: TransportErrorReported | None = None

    @property
    def reliable(self) -> bool:
        return self.transport != "udp"

    @classmethod
    def start(
        cls,
        kind: TxKind,
        request: SipRequest,
        *,
        peer: Address,
        transport: str,
        timers: SipTimers,
        now: float,
        context: object = None,
        flow: Address | None = None,
    ) -> tuple[Transaction, list[TxEffect]]:
        tx = cls(
            kind=kind,
            request=request,
            peer=peer,
            transport=transport,
            timers=timers,
            state=INITIAL_STATE[kind],
            context=context,
            flow=flow,
        )
        return tx, tx._run(INITIAL_ACTIONS[kind], now)

    def next_deadline(self) -> float | None:
        return min(self.deadlines.values()) if self.deadlines else None

    def handle(self, event: TxInput, now: float, *, response: SipResponse | None = None) -> list[TxEffect]:
        rule = TABLES[self.kind].get((self.state, event))
        if rule is None:
            return []
        if response is not None:
            if self.kind in (TxKind.INVITE_SERVER, TxKind.NON_INVITE_SERVER):
                self.last_response = response
            else:
                self.received = response
        next_state, actions = rule
        if next_state is not self.state:
            self.state = next_state
            for timer in [t for t in self.deadlines if next_state not in _LIVE_TIMERS[t]]:
                del self.deadlines[timer]
        return self._run(actions, now)

    def respond(self, response: SipResponse, now: float) -> list[TxEffect]:
        """Server transactions: the TU sends a response."""
        if response.status < 200:
            return self.handle(I.TU_1XX, now, response=response)
        return self.handle(I.TU_2XX if response.status < 300 else I.TU_FINAL, now, response=response)

    def receive_response(self, response: SipResponse, now: float) -> list[TxEffect]:
        """Client transactions: a matching response arrived."""
        if response.status < 200:
            return self.handle(I.RESPONSE_1XX, now, response=response)
        return self.handle(I.RESPONSE_2XX if response.status < 300 else I.RESPONSE_FINAL, now, response=response)

    def transport_error(self, now: float, *, cause: str, detail: str) -> list[TxEffect]:
        """Client transactions: the transport could not deliver the request (§17.1.1.2, §17.1.2.2)."""
        self.transport_failure = TransportErrorReported(cause=cause, detail=detail)
        return self.handle(I.TRANSPORT_ERROR, now)

    def fire_due(self, now: float) -> list[TxEffect]:
        """Fire every timer whose deadline has passed, earliest first."""
        effects: list[TxEffect] = []
        while self.deadlines:
            timer, deadline = min(self.deadlines.items(), key=lambda item: item[1])
            if deadline > now:
                break
            del self.deadlines[timer]
            effects.extend(self.handle(timer, now))
        return effects

    def _run(self, actions: tuple[TxAction, ...], now: float) -> list[TxEffect]:
        effects: list[TxEffect] = []
        for action in actions:
            if action is A.SEND_REQUEST:
                effects.append(Transmit(data=self.request.encode()))
            elif action is A.SEND_RESPONSE and self.last_response is not None:
                effects.append(Transmit(data=self.last_response.encode()))
            elif action is A.SEND_ACK and self.received is not None:
                self.ack = self.ack or build_non_2xx_ack(self.request, self.received)
                effects.append(Transmit(data=self.ack.encode()))
            elif action is A.PASS_RESPONSE and self.received is not None:
                effects.append(ResponsePassed(response=self.received))
            elif action is A.REPORT_TIMEOUT:
                effects.append(TransactionTimedOut())
            elif action is A.REPORT_TRANSPORT_ERROR and self.transport_failure is not None:
                effects.append(self.transport_failure)
            elif action in _ARMS:
                self._arm(action, now)
        # Zero-length timers (D/I/J/K on reliable transports) fire at once rather than a tick later.
        if any(deadline <= now for timer, deadline in self.deadlines.items() if timer not in _RETRANSMIT_TIMERS):
            effects.extend(self.fire_due(now))
        return effects

    def _arm(self, action: TxAction, now: float) -> None:
        timer = _ARMS[action]
        t = self.timers
        if timer in _RETRANSMIT_TIMERS:
            if self.reliable:
                return  # §17.1.1.2, §17.1.2.2, §17.2.1: no retransmissions over reliable transports
            previous = self.intervals.get(timer)
            if action is A.ARM_E_T2:
                interval = t.t2
            elif previous is None:
                interval = t.t1
            else:
                interval = t.backoff(previous, cap=timer is not I.TIMER_A)
            self.intervals[timer] = interval
        else:
            interval = {
                I.TIMER_B: t.b,
                I.TIMER_D: t.d(self.reliable),
                I.TIMER_F: t.f,
                I.TIMER_H: t.h,
                I.TIMER_I: t.i(self.reliable),
                I.TIMER_J: t.j(self.reliable),
                I.TIMER_K: t.k(self.reliable),
                I.TIMER_L: t.l,
                I.TIMER_M: t.m,
            }[timer]
        self.deadlines[timer] = now + interval


def build_non_2xx_ack(invite: SipRequest, response: SipResponse) -> SipRequest:
    """§17.1.1.3: the ACK for a 3xx-6xx goes in the INVITE's transaction (same branch, top Via only)."""
    ack = SipRequest(method="ACK", uri=invite.uri)
    ack.headers.add("Via", invite.headers.values("Via")[0])
    for route in invite.headers.lines("Route"):
        ack.headers.add("Route", route)
    ack.headers.add("Max-Forwards", "70")
    ack.headers.add("From", invite.headers.get("From") or "")
    ack.headers.add("To", response.headers.get("To") or invite.headers.get("To") or "")
    ack.headers.add("Call-ID", invite.call_id)
    ack.headers.add("CSeq", f"{invite.cseq.number} ACK")
    return ack
