"""A small sans-I/O SIP registrar for driving the registration client under a fake clock (RFC 3261 §10.3).

It keeps bindings per AOR, authenticates with digest.py's server side (`DigestChallenger`: HMAC nonces that
expire after `nonce_ttl_s`, so a reused old nonce earns ``stale=true``), answers 423 below `min_expires`,
clamps to `max_expires`, and lists every binding of the AOR in its 200s (RFC 3261 §10.3 step 8). Tests
bend it: `forced` answers the next requests with given statuses and headers, `silent` drops requests,
`list_contacts=False` leaves the 200's Contact out. Every request it receives is kept in `requests`.

`Wire` moves datagrams between SipEndpoints and registrars on one fake clock.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field

from gateway.sip.digest import DigestChallenger, DigestOutcome
from gateway.sip.endpoint import SipEndpoint
from gateway.sip.events import SipEvent
from gateway.sip.message import SipRequest, make_response, parse_message
from gateway.sip.registration_replies import delta_seconds
from gateway.sip.uri import parse_name_addr

Address = tuple[str, int]
Forced = tuple[int, tuple[tuple[str, str], ...]]


@dataclass
class Binding:
    contact: str  # the Contact value as registered (with its parameters)
    uri: str
    expires_at: float
    call_id: str
    cseq: int


class FakeRegistrar:
    def __init__(
        self,
        *,
        realm: str = "carrier.test",
        username: str | None = "auth-user",
        password: str = "secret",
        min_expires: int = 60,
        max_expires: int = 7200,
        nonce_ttl_s: float = 300.0,
        seed: int = 7,
    ) -> None:
        self.realm = realm
        self.username = username
        self.min_expires = min_expires
        self.max_expires = max_expires
        self._rng = random.Random(seed)
        self.challenger = DigestChallenger(
            realm=realm,
            credentials=lambda user: password if user == username else None,
            nonce_secret=b"registrar-test-secret-0123456789",
            nonce_ttl_s=nonce_ttl_s,
        )
        self.bindings: dict[str, dict[str, Binding]] = {}
        self.requests: list[SipRequest] = []
        self.forced: deque[Forced] = deque()
        self.silent = False
        self.list_contacts = True
        self.always_stale = False

    def contacts(self, aor_user: str, now: float) -> list[Binding]:
        return [b for b in self.bindings.get(aor_user, {}).values() if b.expires_at > now]

    def handle(self, data: bytes, now: float) -> bytes | None:
        request = parse_message(data)
        assert isinstance(request, SipRequest), "a registrar receives requests"
        self.requests.append(request)
        if self.silent:
            return None
        if self.forced:
            status, headers = self.forced.popleft()
            return make_response(request, status, to_tag="reg", headers=headers).encode()
        if self.username is not None:
            verdict = None
            authorization = request.headers.get("Authorization")
            if authorization is not None:
                verdict = self.challenger.verify("REGISTER", authorization, now, uri=str(request.uri))
            if verdict is None or not verdict.ok or self.always_stale:
                stale = self.always_stale or (verdict is not None and verdict.outcome is DigestOutcome.STALE)
                challenge = self.challenger.challenge(now, salt=self._rng.randbytes(16), stale=stale)
                return make_response(request, 401, to_tag="reg", headers=(("WWW-Authenticate", challenge),)).encode()
        return self._save(request, now).encode()

    def _save(self, request: SipRequest, now: float) -> object:
        aor_user = request.to.uri.user or ""
        bindings = self.bindings.setdefault(aor_user, {})
        header_expires = delta_seconds(request.headers.get("Expires"))
        for value in request.headers.values("Contact"):
            contact = parse_name_addr(value)
            asked = delta_seconds(contact.param("expires"))
            asked = header_expires if asked is None else asked
            asked = 3600 if asked is None else asked
            key = str(contact.uri)
            if asked == 0:
                bindings.pop(key, None)
                continue
            if asked < self.min_expires:
                return make_response(request, 423, to_tag="reg", headers=(("Min-Expires", str(self.min_expires)),))
            existing = bindings.get(key)
            if existing is not None and existing.call_id == request.call_id and request.cseq.number <= existing.cseq:
                return make_response(request, 500, "Out of order", to_tag="reg")
            granted = min(asked, self.max_expires)
            bindings[key] = Binding(
                contact=value,
                uri=key,
                expires_at=now + granted,
                call_id=request.call_id,
                cseq=request.cseq.number,
            )
        listed: list[tuple[str, str]] = []
        if self.list_contacts:
            for binding in self.contacts(aor_user, now):
                bare = parse_name_addr(binding.contact)
                params = tuple((k, v) for k, v in bare.params if k.lower() != "expires")
                remaining = round(binding.expires_at - now)
                listed.append(("Contact", str(bare.with_params((*params, ("expires", str(remaining)))))))
        return make_response(request, 200, to_tag="reg", headers=tuple(listed))


@dataclass
class Wire:
    """Endpoints and registrars on one fake clock; datagrams are delivered at once, in order."""

    now: float = 1000.0
    endpoints: dict[Address, SipEndpoint] = field(default_factory=dict)
    registrars: dict[Address, FakeRegistrar] = field(default_factory=dict)
    events: dict[Address, list[SipEvent]] = field(default_factory=dict)
    sent: list[tuple[Address, Address, bytes]] = field(default_factory=list)

    def add_endpoint(self, address: Address, endpoint: SipEndpoint) -> SipEndpoint:
        self.endpoints[address] = endpoint
        self.events[address] = []
        return endpoint

    def pump(self) -> None:
        for _ in range(10_000):
            moved = False
            for address, endpoint in self.endpoints.items():
                self.events[address].extend(endpoint.events())
                for out in endpoint.datagrams():
                    moved = True
                    self.sent.append((address, out.destination, out.data))
                    registrar = self.registrars.get(out.destination)
                    if registrar is None:
                        continue
                    answer = registrar.handle(out.data, self.now)
                    if answer is not None:
                        endpoint.receive(answer, out.destination, transport=out.transport, now=self.now)
            if not moved:
                return
        raise AssertionError("the wire did not settle")

    def run_until(self, until: float) -> None:
        """Advance the clock to `until`, firing every endpoint timer due on the way, in order."""
        self.pump()
        while True:
            due = [d for ep in self.endpoints.values() if (d := ep.next_deadline()) is not None and d <= until]
            if not due:
                break
            self.now = max(self.now, min(due))
            for endpoint in self.endpoints.values():
                deadline = endpoint.next_deadline()
                if deadline is not None and deadline <= self.now:
                    endpoint.handle_timers(self.now)
            self.pump()
        self.now = until

    def advance(self, seconds: float) -> None:
        self.run_until(self.now + seconds)

    def of_type(self, address: Address, kind: type) -> list[SipEvent]:
        self.pump()
        return [event for event in self.events[address] if isinstance(event, kind)]

    def requests_to(self, registrar: Address) -> list[SipRequest]:
        return self.registrars[registrar].requests
