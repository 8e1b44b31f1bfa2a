"""What the SIP core reports to the application, and the datagrams it wants sent.

Owns: `CallHandle` (the application's name for a call leg), `Outgoing` (bytes + destination + transport,
drained with `SipEndpoint.datagrams()`), `SipStats` (counters for metrics) and the `SipEvent` dataclasses
(frozen, keyword-only, named in the past tense; drained with `SipEndpoint.events()`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NewType

CallHandle = NewType("CallHandle", str)
Address = tuple[str, int]
Side = Literal["local", "remote"]
HeaderList = tuple[tuple[str, str], ...]


@dataclass(frozen=True, kw_only=True)
class Outgoing:
    """One message to send. `destination` may be a host name (from a URI) that the glue resolves; for tcp
    and tls it names the connection the request came in on, or the peer to connect to (for tls also the name
    its certificate must carry). `flow`, set on requests within a dialog over a connection, names the
    connection to use instead while it is still open (core.Core.next_hop)."""

    data: bytes
    destination: Address
    transport: str
    flow: Address | None = None


@dataclass(kw_only=True)
class SipStats:
    """Counters, monotonically increasing, for the worker's metrics."""

    messages_received: int = 0
    requests_received: int = 0
    responses_received: int = 0
    malformed_answered: int = 0  # answered 4xx/5xx because they could not be accepted
    malformed_dropped: int = 0  # could not even be answered
    policy_rejected: int = 0  # 403
    policy_dropped: int = 0  # rate limited (or ACK from a forbidden source)
    auth_challenged: int = 0  # 401 sent
    auth_failed: int = 0  # a wrong answer to a challenge (each also counted as a 401 sent)
    blocked_dropped: int = 0  # from a source (or for a username) blocked after failed authentications
    scanner_dropped: int = 0  # from a known scanner's User-Agent
    sources_blocked: int = 0  # blocks started (sources and usernames)
    retransmissions_received: int = 0
    retransmissions_sent: int = 0
    unmatched_responses: int = 0
    unmatched_acks: int = 0
    internal_errors: int = 0  # a bug in the core caught at the boundary
    datagrams_sent: int = 0


# --- incoming calls ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CallOffered:
    """An initial INVITE passed policy. Answer with `ring`/`answer`/`reject`."""

    call: CallHandle
    call_id: str
    source: Address
    transport: str
    request_uri: str
    from_uri: str
    from_display_name: str | None
    to_uri: str
    headers: HeaderList
    body: bytes
    content_type: str | None


@dataclass(frozen=True, kw_only=True)
class CallCancelled:
    """The caller CANCELled before we sent a final response; 487 was sent."""

    call: CallHandle


@dataclass(frozen=True, kw_only=True)
class CallEstablished:
    """The ACK for our 2xx arrived. `body` is the SDP answer of a late offer (empty otherwise)."""

    call: CallHandle
    body: bytes


@dataclass(frozen=True, kw_only=True)
class CallEnded:
    """The call is over. `by` says who ended it; `status` is set when a SIP status caused it."""

    call: CallHandle
    reason: str
    by: Side
    status: int | None = None


# --- outgoing calls ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class OutboundCallProgressed:
    """A provisional response (101-199). ``body`` with ``content_type`` application/sdp is early media's SDP;
    ``to_tag`` names the early dialog (each fork of a forked INVITE has its own, RFC 3261 §12.1.2; None: the
    1xx had no To tag, so it made no early dialog)."""

    call: CallHandle
    status: int
    reason: str
    body: bytes
    content_type: str | None = None
    to_tag: str | None = None


@dataclass(frozen=True, kw_only=True)
class OutboundCallAnswered:
    """A 2xx arrived and was ACKed; `body` is the SDP answer; `to_tag` names the dialog (the fork) that answered."""

    call: CallHandle
    body: bytes
    content_type: str | None
    to_tag: str | None = None


@dataclass(frozen=True, kw_only=True)
class OutboundCallFailed:
    """A final 3xx-6xx, a timeout (408) or a failed authentication ended the attempt. `transport_error`
    names what failed when the INVITE never got out (connect, tls, resolve; `status` is then 503 and
    `reason` says how, §8.1.3.1); None when the peer answered or was silent."""

    call: CallHandle
    status: int
    reason: str
    transport_error: str | None = None


# --- mid-call ---------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ReinviteReceived:
    """A re-INVITE or an UPDATE with a body: answer with `answer_reinvite` or `reject_reinvite`.

    `body` is None for a re-INVITE without an offer (the answer must then carry our offer)."""

    call: CallHandle
    method: str
    body: bytes | None
    content_type: str | None


@dataclass(frozen=True, kw_only=True)
class ReinviteAnswered:
    """Our re-INVITE / UPDATE got a 2xx; `body` is the peer's answer (may be empty for UPDATE)."""

    call: CallHandle
    method: str
    body: bytes


@dataclass(frozen=True, kw_only=True)
class ReinviteAcked:
    """The ACK of our 2xx to a re-INVITE that came without an offer carries the peer's answer to the offer our
    2xx made (RFC 3261 §14.2, RFC 3264 §8)."""

    call: CallHandle
    body: bytes


@dataclass(frozen=True, kw_only=True)
class ReinviteFailed:
    """Our re-INVITE / UPDATE was refused; the session goes on unchanged (491: retry later)."""

    call: CallHandle
    method: str
    status: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class SessionRefreshed:
    """A session refresh (RFC 4028) completed; `by` says who refreshed."""

    call: CallHandle
    interval: int
    by: Side


@dataclass(frozen=True, kw_only=True)
class DtmfInfoReceived:
    """INFO application/dtmf-relay (Signal=5, Duration=160)."""

    call: CallHandle
    digit: str
    duration_ms: int


@dataclass(frozen=True, kw_only=True)
class TransferProgressed:
    """The peer accepted our REFER (status 202) or NOTIFYed its progress (sipfrag status)."""

    call: CallHandle
    status: int
    reason: str
    final: bool


@dataclass(frozen=True, kw_only=True)
class TransferFailed:
    """Our REFER was refused, timed out, or the NOTIFYed sipfrag carried a final failure."""

    call: CallHandle
    status: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class TransferDeclined:
    """The core refused the peer's REFER itself: 400 (no Refer-To, or a bad one), 491 (another one pending)."""

    call: CallHandle
    refer_to: str
    status: int = 603
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class ReferReceived:
    """The peer REFERs us to `refer_to` (RFC 3515: we are the transferee). Answer with `accept_refer` (202 and
    NOTIFY 100 Trying) or `decline_refer` (603), then `notify_refer` the new call's progress and result.

    `replaces` is the Replaces header the Refer-To URI carried (RFC 3891), to copy into the new INVITE;
    `subscription` is False when the referrer asked for no NOTIFYs (Refer-Sub: false, RFC 4488)."""

    call: CallHandle
    refer_to: str
    replaces: str | None
    referred_by: str | None
    subscription: bool


# --- out of dialog ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class OptionsReceived:
    """An OPTIONS was answered 200 (`call` is set when it came inside a dialog)."""

    call: CallHandle | None
    source: Address


@dataclass(frozen=True, kw_only=True)
class OptionsAnswered:
    """The response (or 408 timeout) to an OPTIONS sent with `send_options`."""

    request_id: str
    status: int


# --- registration (gateway/sip/registration.py) ----------------------------------------------


RegistrationOutcome = Literal["rejected", "auth_rejected", "timeout"]


@dataclass(frozen=True, kw_only=True)
class TrunkRegistered:
    """A REGISTER of ours was accepted (2xx): the registrar binds our contact to the AOR for `expires` s.

    `refreshed`: a binding we already held was extended. `contact_listed` is False when the 2xx did not list
    our contact (RFC 3261 §10.3 says it must): the registrar may have stored something else. `other_contacts`
    counts the other bindings it listed for the AOR (other workers' contacts, typically)."""

    registrar: str
    aor: str
    contact: str
    expires: int
    status: int
    refreshed: bool
    contact_listed: bool
    other_contacts: int


@dataclass(frozen=True, kw_only=True)
class TrunkRegistrationFailed:
    """An attempt to register (or to refresh) failed; the next one comes `retry_in` seconds later.

    `status` is the final response's (408 when none came); `outcome` says which kind of failure."""

    registrar: str
    aor: str
    status: int
    reason: str
    outcome: RegistrationOutcome
    failures: int
    retry_in: float


@dataclass(frozen=True, kw_only=True)
class TrunkUnregistered:
    """The client stopped: our binding was removed (`ok`), there was none, or removing it failed or was given
    up (`ok` False, `reason` says why). The last event of a registration."""

    registrar: str
    aor: str
    ok: bool
    status: int | None
    reason: str


# --- the edge ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class AuthenticationFailed:
    """A request answered our challenge with wrong credentials (a 401 went back, unless it caused a block)."""

    source: Address
    transport: str
    username: str | None
    method: str
    user_agent: str | None


@dataclass(frozen=True, kw_only=True)
class SourceBlocked:
    """Too many failed authentications: `scope` "source" (an address) or "user" (a username from anywhere)
    is refused for `block_s` seconds; requests it sends meanwhile are dropped unanswered."""

    scope: str
    key: str
    failures: int
    block_s: float
    transport: str


SipEvent = (
    CallOffered
    | CallCancelled
    | CallEstablished
    | CallEnded
    | OutboundCallProgressed
    | OutboundCallAnswered
    | OutboundCallFailed
    | ReinviteReceived
    | ReinviteAnswered
    | ReinviteAcked
    | ReinviteFailed
    | SessionRefreshed
    | DtmfInfoReceived
    | TransferProgressed
    | TransferFailed
    | TransferDeclined
    | ReferReceived
    | OptionsReceived
    | OptionsAnswered
    | TrunkRegistered
    | TrunkRegistrationFailed
    | TrunkUnregistered
    | AuthenticationFailed
    | SourceBlocked
)
