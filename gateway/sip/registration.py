"""Outbound registration: keep our Contact bound to an address-of-record at a registrar (RFC 3261 §10.2).

Owns: `RegistrationConfig` (what to register where, with which credentials), `RegistrationTiming` (when to
refresh, how to back off, as a value) and `RegistrationClient`, the state machine of one binding: it builds
each REGISTER (without Via: the transport's business), reads each final response (registration_replies.py),
and says when it next wants the clock. Sans-I/O: `now` comes in, requests and events go out.
registrations.py runs the clients on the endpoint's core, in non-INVITE client transactions (§17.1.2:
retransmissions, Timer F).

Rules, from §10.2, §10.3, §22 and RFC 5626 §4.5 (backoff):

* One Call-ID and From tag for the client's life; CSeq grows by one with every REGISTER: refreshes,
  answers to challenges and the final removal included (§10.2: the registrar orders a Call-ID's requests by
  it, and drops a binding update whose CSeq is not higher).
* Never a new REGISTER while one is outstanding (§10.2): a stop that comes during one waits for its answer.
* Only our own Contact is ever added or removed, never ``*``: other workers bind their own contacts to the
  same AOR. The Contact carries ``+sip.instance`` (RFC 5626 §4.1) when configured, so a restarted worker
  replaces its old binding at a registrar that matches on it.
* 401/407 are answered with digest credentials (Authorization / Proxy-Authorization, digest.py), once per
  challenge: a challenge to a request that already answered a challenge of this attempt is a refusal of the
  credentials ("auth_rejected", naming the realm and the user), never a loop, unless it says ``stale=true``
  (right credentials, old nonce), which is answered with the new nonce up to `MAX_STALE_ANSWERS` times. The
  last challenge's nonce is reused for the next REGISTER (nc + 1, §22.3), so a refresh costs one round trip;
  a challenge to such a request is a fresh one and is answered.
* 423 Interval Too Brief: ask again with its Min-Expires (kept for later refreshes), when that is longer than
  what we asked, up to `MAX_TOO_BRIEF_ANSWERS` times per attempt.
* 2xx: the granted time is our contact's ``expires`` parameter in the response, else its Expires header, else
  what we asked; the registrar may grant less than asked. A 2xx that does not list our contact is reported
  (`contact_listed=False`). The refresh goes out at `refresh_fraction` of the granted time, less up to
  `refresh_spread` of it drawn at random for each grant, so that workers started together (a deployment
  rolled out, a registrar back from an outage) do not refresh together for ever after.
* Any other final response, a 2xx granting nothing, or no response (Timer F) fails the attempt; the next one
  starts after an exponential backoff with jitter: up to ``min(retry_max_s, retry_min_s * 2**(failures-1))``,
  at least half of that, and never before a Retry-After (capped at `retry_after_max_s`).
* Stop: with a binding held (or possibly held: a refresh failed before it lapsed) the client sends our contact
  with ``Expires: 0``; without one it stops at once. Removal is bounded: `stop(now, within=...)` gives up at
  ``now + within`` whatever is outstanding, so a dead registrar never holds a shutdown.

The state table, keyed on (state, input); inputs are classified from the final response (or timer, or call)
before the lookup, and a pair missing from the table is ignored (a response after the client gave up, say):

    IDLE           START                  -> REGISTERING     REGISTER (a new attempt)
    IDLE           STOP_UNBOUND           -> STOPPED         report: nothing to remove
    REGISTERING    ACCEPTED               -> REGISTERED      bind: refresh timer, TrunkRegistered
    REGISTERING    CHALLENGED|TOO_BRIEF   -> REGISTERING     REGISTER again, same attempt (credentials / longer)
    REGISTERING    REFUSED|TIMED_OUT      -> FAILED          retry timer, TrunkRegistrationFailed
    REGISTERING    STOP_BOUND|UNBOUND     -> STOPPING        wait for the answer (bounded)
    REGISTERED     REFRESH_DUE            -> REFRESHING      REGISTER (a new attempt)
    REGISTERED     STOP_BOUND             -> UNREGISTERING   REGISTER with Expires: 0
    REGISTERED     STOP_UNBOUND           -> STOPPED         report: nothing to remove (it lapsed)
    REFRESHING     (as REGISTERING)       -> (as REGISTERING, with REFRESHING for REGISTERING)
    FAILED         RETRY_DUE              -> REGISTERING     REGISTER (a new attempt)
    FAILED         STOP_BOUND             -> UNREGISTERING   REGISTER with Expires: 0
    FAILED         STOP_UNBOUND           -> STOPPED         report: nothing to remove
    STOPPING       SETTLED_BOUND          -> UNREGISTERING   REGISTER with Expires: 0
    STOPPING       SETTLED_UNBOUND        -> STOPPED         report: nothing to remove
    STOPPING       GIVE_UP                -> STOPPED         report: gave up
    UNREGISTERING  ACCEPTED               -> STOPPED         report: removed
    UNREGISTERING  CHALLENGED             -> UNREGISTERING   Expires: 0 again with credentials
    UNREGISTERING  TOO_BRIEF|REFUSED|TIMED_OUT -> STOPPED    report: removal failed
    UNREGISTERING  GIVE_UP                -> STOPPED         report: gave up

In STOPPING every final response (or timeout) is SETTLED_BOUND when it was a 2xx or a binding is still held,
else SETTLED_UNBOUND.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from .config import CONFIGURED_PROXY, ProxyChoice
from .digest import DigestChallenge, DigestError
from .digest import authorization as digest_authorization
from .errors import RemoteProtocolError, SipConfigError
from .events import (
    SipEvent,
    TrunkRegistered,
    TrunkRegistrationFailed,
    TrunkUnregistered,
)
from .message import SipRequest, SipResponse
from .registration_replies import MAX_DELTA_SECONDS, Asked, Reply, read_reply
from .uri import SipUri, parse_name_addr, parse_uri


@dataclass(frozen=True, kw_only=True)
class RegistrationTiming:
    """When to refresh and how to back off after a failure (see the module docstring)."""

    refresh_fraction: float = 0.5
    refresh_spread: float = 0.1  # the refresh goes out between fraction - spread and fraction of the grant
    retry_min_s: float = 4.0
    retry_max_s: float = 300.0
    retry_after_max_s: float = 3600.0

    def __post_init__(self) -> None:
        if not 0.1 <= self.refresh_fraction <= 0.9:
            raise SipConfigError("refresh_fraction must be within 0.1-0.9 of the granted time")
        if not 0 <= self.refresh_spread <= self.refresh_fraction - 0.1:
            raise SipConfigError("refresh_spread must be within 0 and refresh_fraction - 0.1")
        if not 0 < self.retry_min_s <= self.retry_max_s:
            raise SipConfigError("backoff needs 0 < retry_min_s <= retry_max_s")
        if self.retry_after_max_s < self.retry_max_s:
            raise SipConfigError("retry_after_max_s must be at least retry_max_s")

    def refresh_after(self, granted: float, rng: random.Random) -> float:
        """How long after a grant of `granted` seconds the refresh goes out."""
        return granted * (self.refresh_fraction - self.refresh_spread * rng.random())

    def backoff(self, failures: int, rng: random.Random) -> float:
        """RFC 5626 §4.5: up to min(max, min * 2**(failures-1)), at least half of it."""
        ceiling = min(self.retry_max_s, self.retry_min_s * 2.0 ** min(failures - 1, 40))
        return ceiling * rng.uniform(0.5, 1.0)


@dataclass(frozen=True, kw_only=True)
class RegistrationConfig:
    """One binding: our contact for `aor` at `registrar`, with `username`/`password` for its challenges."""

    registrar: str  # Request-URI of the REGISTERs, e.g. sip:sip.carrier.example;transport=tcp
    aor: str  # address-of-record (To and From), e.g. sip:+15550100@carrier.example
    username: str | None = None  # digest username (may differ from the AOR's user part)
    password: str | None = field(default=None, repr=False)
    expires: int = 3600  # what we ask for; the registrar may grant less (or more)
    instance_id: str | None = None  # RFC 5626 +sip.instance, e.g. urn:uuid:<uuid>
    timing: RegistrationTiming = field(default_factory=RegistrationTiming)
    # A trunk's own outbound proxy (a URI, or None: straight to the registrar) instead of the endpoint's.
    outbound_proxy: ProxyChoice = CONFIGURED_PROXY

    def __post_init__(self) -> None:
        for name, text in (("registrar", self.registrar), ("aor", self.aor)):
            try:
                uri = parse_uri(text)
            except RemoteProtocolError as exc:
                raise SipConfigError(f"bad {name} URI {text!r}: {exc.reason}") from exc
            if not uri.is_sip or not uri.host:
                raise SipConfigError(f"the {name} must be a sip: URI with a host, got {text!r}")
        if parse_uri(self.aor).user is None:
            raise SipConfigError(f"the AOR needs a user part (sip:user@domain), got {self.aor!r}")
        if not 1 <= self.expires <= MAX_DELTA_SECONDS:
            raise SipConfigError(f"expires must be within 1-{MAX_DELTA_SECONDS} s")
        if (self.password is None) != (self.username is None):
            raise SipConfigError("give both a digest username and a password, or neither")
        if self.instance_id is not None and any(ch in self.instance_id for ch in '"<>\r\n'):
            raise SipConfigError("instance_id must not contain quotes or angle brackets")

    @property
    def registrar_uri(self) -> SipUri:
        return parse_uri(self.registrar)


class RegState(StrEnum):
    IDLE = "idle"
    REGISTERING = "registering"
    REGISTERED = "registered"
    REFRESHING = "refreshing"
    FAILED = "failed"  # the last attempt failed; the next is scheduled
    STOPPING = "stopping"  # stopped while a REGISTER was outstanding: waiting for its answer
    UNREGISTERING = "unregistering"
    STOPPED = "unregistered"


class RegInput(StrEnum):
    START = "start"
    REFRESH_DUE = "refresh_due"
    RETRY_DUE = "retry_due"
    GIVE_UP = "give_up"
    STOP_BOUND = "stop_bound"
    STOP_UNBOUND = "stop_unbound"
    ACCEPTED = "accepted"
    CHALLENGED = "challenged"
    TOO_BRIEF = "too_brief"
    REFUSED = "refused"
    TIMED_OUT = "timed_out"
    SETTLED_BOUND = "settled_bound"
    SETTLED_UNBOUND = "settled_unbound"


S, I = RegState, RegInput  # noqa: E741 — the table below reads better short

# (state, input) -> (next state, action name); see the module docstring.
TABLE: dict[tuple[RegState, RegInput], tuple[RegState, str]] = {
    (S.IDLE, I.START): (S.REGISTERING, "_register"),
    (S.IDLE, I.STOP_UNBOUND): (S.STOPPED, "_nothing_to_remove"),
    (S.REGISTERED, I.REFRESH_DUE): (S.REFRESHING, "_register"),
    (S.REGISTERED, I.STOP_BOUND): (S.UNREGISTERING, "_unregister"),
    (S.REGISTERED, I.STOP_UNBOUND): (S.STOPPED, "_nothing_to_remove"),
    (S.FAILED, I.RETRY_DUE): (S.REGISTERING, "_register"),
    (S.FAILED, I.STOP_BOUND): (S.UNREGISTERING, "_unregister"),
    (S.FAILED, I.STOP_UNBOUND): (S.STOPPED, "_nothing_to_remove"),
    (S.STOPPING, I.SETTLED_BOUND): (S.UNREGISTERING, "_unregister"),
    (S.STOPPING, I.SETTLED_UNBOUND): (S.STOPPED, "_nothing_to_remove"),
    (S.STOPPING, I.GIVE_UP): (S.STOPPED, "_give_up"),
    (S.UNREGISTERING, I.ACCEPTED): (S.STOPPED, "_removed"),
    (S.UNREGISTERING, I.CHALLENGED): (S.UNREGISTERING, "_again"),
    (S.UNREGISTERING, I.TOO_BRIEF): (S.STOPPED, "_removal_failed"),
    (S.UNREGISTERING, I.REFUSED): (S.STOPPED, "_removal_failed"),
    (S.UNREGISTERING, I.TIMED_OUT): (S.STOPPED, "_removal_failed"),
    (S.UNREGISTERING, I.GIVE_UP): (S.STOPPED, "_give_up"),
}
for _sending in (S.REGISTERING, S.REFRESHING):
    TABLE.update(
        {
            (_sending, I.ACCEPTED): (S.REGISTERED, "_bind"),
            (_sending, I.CHALLENGED): (_sending, "_again"),
            (_sending, I.TOO_BRIEF): (_sending, "_again"),
            (_sending, I.REFUSED): (S.FAILED, "_fail"),
            (_sending, I.TIMED_OUT): (S.FAILED, "_fail"),
            (_sending, I.STOP_BOUND): (S.STOPPING, "_wait_for_answer"),
            (_sending, I.STOP_UNBOUND): (S.STOPPING, "_wait_for_answer"),
        }
    )
del S, I


@dataclass(frozen=True, kw_only=True)
class RegistrationStatus:
    """What a client shows the outside (times on the `now` clock it is driven with)."""

    state: RegState
    registrar: str
    aor: str
    contact: str
    expires: int | None  # the last granted time
    expires_at: float | None  # when the binding we hold lapses (None: none held)
    refresh_at: float | None
    next_attempt_at: float | None  # after a failure
    last_status: int | None
    last_error: str
    attempts: int  # attempts since the binding was last granted (the one under way included)
    failures: int  # consecutive failed attempts
    cseq: int


class RegistrationClient:
    """One binding's state machine. Drive it through `Registrations` (which owns the transactions)."""

    def __init__(
        self,
        config: RegistrationConfig,
        *,
        contact: str,
        call_id_host: str,
        rng: random.Random,
        headers: tuple[tuple[str, str], ...] = (),
        transaction_timeout_s: float = 32.0,
    ) -> None:
        self.config = config
        self._rng = rng
        contact_addr = parse_name_addr(contact)
        if config.instance_id is not None:
            contact_addr = contact_addr.with_params(
                (*contact_addr.params, ("+sip.instance", f"<{config.instance_id}>"))
            )
        self.contact = str(contact_addr)
        self._contact_uri = contact_addr.uri
        self._headers = headers
        self._timeout_s = transaction_timeout_s
        self.call_id = f"{_token(rng, 96)}@{call_id_host}"
        self._from_tag = _token(rng, 32)
        self.state = RegState.IDLE
        self.cseq = 0
        self.expires_asked = config.expires
        self.outbox: list[SipRequest] = []
        self.events: list[SipEvent] = []
        self._request: SipRequest | None = None  # the REGISTER outstanding
        self._timer_at: float | None = None
        self._stop_at: float | None = None
        self._stop_within = 0.0
        self._reply: Reply | None = None
        # The binding and the last outcome.
        self.granted: int | None = None
        self.expires_at: float | None = None
        self.refresh_at: float | None = None
        self.retry_at: float | None = None
        self.last_status: int | None = None
        self.last_error = ""
        self.attempts = 0
        self.failures = 0
        # Digest: the last challenge (reused with nc + 1) and this attempt's answers.
        self._challenge: tuple[str, DigestChallenge] | None = None  # (header to answer with, challenge)
        self._nc = 0
        self._answered = False  # this attempt answered a challenge received in it
        self._stale_answers = 0
        self._too_brief_answers = 0
        self._removing = False

    # --- inputs ----------------------------------------------------------------------------------

    def start(self, now: float) -> None:
        self._step(RegInput.START, now)

    def stop(self, now: float, *, within: float) -> None:
        """Remove our binding (if any), giving up `within` seconds from now. Idempotent."""
        if self.state in (RegState.STOPPING, RegState.UNREGISTERING, RegState.STOPPED):
            return
        self._stop_within = max(0.0, within)
        self._stop_at = now + self._stop_within
        self._step(RegInput.STOP_BOUND if self._bound(now) else RegInput.STOP_UNBOUND, now)

    def on_response(self, request: SipRequest, response: SipResponse | None, now: float) -> None:
        """A response (None: the transaction timed out) to one of our REGISTERs."""
        if request is not self._request or (response is not None and response.status < 200):
            return  # provisional, or for a request we no longer wait on
        self._request = None
        reply = self._reply = self._read(response)
        if self.state is RegState.STOPPING:
            bound = reply.kind == "accepted" or self._bound(now)
            self._step(RegInput.SETTLED_BOUND if bound else RegInput.SETTLED_UNBOUND, now)
        else:
            self._step(RegInput(reply.kind), now)

    def next_deadline(self) -> float | None:
        if self.state in (RegState.STOPPING, RegState.UNREGISTERING):
            return self._stop_at
        return self._timer_at

    def handle_timer(self, now: float) -> None:
        deadline = self.next_deadline()
        if deadline is None or deadline > now:
            return
        if self.state in (RegState.STOPPING, RegState.UNREGISTERING):
            self._step(RegInput.GIVE_UP, now)
        elif self.state is RegState.REGISTERED:
            self._step(RegInput.REFRESH_DUE, now)
        elif self.state is RegState.FAILED:
            self._step(RegInput.RETRY_DUE, now)

    def status(self) -> RegistrationStatus:
        return RegistrationStatus(
            state=self.state,
            registrar=self.config.registrar,
            aor=self.config.aor,
            contact=self.contact,
            expires=self.granted,
            expires_at=self.expires_at,
            refresh_at=self.refresh_at if self.state is RegState.REGISTERED else None,
            next_attempt_at=self.retry_at if self.state is RegState.FAILED else None,
            last_status=self.last_status,
            last_error=self.last_error,
            attempts=self.attempts,
            failures=self.failures,
            cseq=self.cseq,
        )

    @property
    def registered(self) -> bool:
        """We hold a binding the registrar granted (refreshing it included)."""
        return self.state in (RegState.REGISTERED, RegState.REFRESHING)

    # --- the table -------------------------------------------------------------------------------

    def _step(self, event: RegInput, now: float) -> None:
        entry = TABLE.get((self.state, event))
        if entry is None:
            return
        next_state, action = entry
        self.state = next_state
        handler: Callable[[float], None] = getattr(self, action)
        handler(now)

    def _bound(self, now: float) -> bool:
        return self.expires_at is not None and self.expires_at > now

    # --- actions ---------------------------------------------------------------------------------

    def _register(self, now: float) -> None:
        self._new_attempt()
        self.attempts += 1
        self._send(self.expires_asked, now)

    def _unregister(self, now: float) -> None:
        self._new_attempt()
        self._removing = True
        self._send(0, now)

    def _again(self, now: float) -> None:
        self._send(0 if self._removing else self.expires_asked, now)

    def _wait_for_answer(self, now: float) -> None:
        self._timer_at = None

    def _bind(self, now: float) -> None:
        reply = self._reply
        assert reply is not None
        refreshed = self._bound(now)
        self.granted = reply.expires
        self.expires_at = now + reply.expires
        self.refresh_at = self._timer_at = now + self.config.timing.refresh_after(reply.expires, self._rng)
        self.retry_at = None
        self.attempts = self.failures = 0
        self.last_status, self.last_error = reply.status, ""
        self.events.append(
            TrunkRegistered(
                registrar=self.config.registrar,
                aor=self.config.aor,
                contact=self.contact,
                expires=reply.expires,
                status=reply.status,
                refreshed=refreshed,
                contact_listed=reply.contact_listed,
                other_contacts=reply.other_contacts,
            )
        )

    def _fail(self, now: float) -> None:
        reply = self._reply
        assert reply is not None
        self.failures += 1
        delay = self.config.timing.backoff(self.failures, self._rng)
        if reply.retry_after is not None:
            delay = max(delay, min(reply.retry_after, self.config.timing.retry_after_max_s))
        self.retry_at = self._timer_at = now + delay
        self.refresh_at = None
        self.last_status, self.last_error = reply.status, reply.reason
        if not self._bound(now):
            self.expires_at = None
        self.events.append(
            TrunkRegistrationFailed(
                registrar=self.config.registrar,
                aor=self.config.aor,
                status=reply.status,
                reason=reply.reason,
                outcome=reply.outcome,
                failures=self.failures,
                retry_in=delay,
            )
        )

    def _nothing_to_remove(self, now: float) -> None:
        self._finish(ok=True, status=None, reason="no binding was held", now=now)

    def _removed(self, now: float) -> None:
        reply = self._reply
        assert reply is not None
        self._finish(ok=True, status=reply.status, reason="binding removed", now=now)

    def _removal_failed(self, now: float) -> None:
        reply = self._reply
        assert reply is not None
        self._finish(ok=False, status=reply.status, reason=reply.reason, now=now)

    def _give_up(self, now: float) -> None:
        reason = (
            f"no final answer from {self.config.registrar} within {self._stop_within:g} s of the stop; "
            "a binding left there lapses at its expiry"
        )
        self._finish(ok=False, status=None, reason=reason, now=now)

    def _finish(self, *, ok: bool, status: int | None, reason: str, now: float) -> None:
        self._timer_at = self._stop_at = self.refresh_at = self.retry_at = None
        self._request = None
        self.expires_at = None
        if not ok:
            self.last_error = reason
        if status is not None:
            self.last_status = status
        self.events.append(
            TrunkUnregistered(registrar=self.config.registrar, aor=self.config.aor, ok=ok, status=status, reason=reason)
        )

    # --- requests --------------------------------------------------------------------------------

    def _new_attempt(self) -> None:
        self._answered = False
        self._stale_answers = self._too_brief_answers = 0
        self._timer_at = None

    def _send(self, expires: int, now: float) -> None:
        """The next REGISTER (CSeq + 1), with credentials for the last challenge when we have one."""
        self.cseq += 1
        uri = self.config.registrar_uri
        request = SipRequest(method="REGISTER", uri=uri)
        for name, value in (
            ("Max-Forwards", "70"),
            ("From", f"<{self.config.aor}>;tag={self._from_tag}"),
            ("To", f"<{self.config.aor}>"),
            ("Call-ID", self.call_id),
            ("CSeq", f"{self.cseq} REGISTER"),
            # §10.2.2: a removal says 0 in the header and, for registrars that read only the contact's, there too.
            ("Contact", self.contact if expires else f"{self.contact};expires=0"),
            ("Expires", str(expires)),
            *self._headers,
        ):
            request.headers.add(name, value)
        credentials = self._credentials(str(uri))
        if credentials is not None:
            request.headers.add(*credentials)
        self._request = request
        self.outbox.append(request)

    def _credentials(self, uri: str) -> tuple[str, str] | None:
        if self._challenge is None or self.config.username is None or self.config.password is None:
            return None
        header, challenge = self._challenge
        self._nc += 1
        try:
            value = digest_authorization(
                challenge,
                method="REGISTER",
                uri=uri,
                username=self.config.username,
                password=self.config.password,
                cnonce=_token(self._rng, 64),
                nc=self._nc,
            )
        except (DigestError, ValueError):
            return None
        return header, value

    # --- reading responses -----------------------------------------------------------------------

    def _read(self, response: SipResponse | None) -> Reply:
        """Classify a final response (registration_replies.py) and keep what the attempt learnt from it."""
        reply = read_reply(
            response,
            Asked(
                registrar=self.config.registrar,
                username=self.config.username,
                has_password=self.config.password is not None,
                expires=0 if self._removing else self.expires_asked,
                contact_uri=self._contact_uri,
                instance_id=self.config.instance_id,
                answered=self._answered,
                stale_answers=self._stale_answers,
                too_brief_answers=self._too_brief_answers,
                timeout_s=self._timeout_s,
            ),
        )
        if reply.challenge is not None:
            if self._answered:
                self._stale_answers += 1
            self._answered = True
            self._challenge = reply.challenge
            self._nc = 0
        if reply.min_expires is not None:
            self._too_brief_answers += 1
            self.expires_asked = reply.min_expires
        return reply


def _token(rng: random.Random, bits: int) -> str:
    return f"{rng.getrandbits(bits):0{bits // 4}x}"
