"""An in-memory network of SipEndpoints under a fake clock in milliseconds, with deterministic loss.

Datagrams go from one endpoint's outbox to the endpoint bound at the destination address, with the
sender's address as the source. `drop` decides per datagram (for loss tests); `log` records every
delivery's start line so tests can assert on the exact exchange.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.sip.auth import AuthCheck
from gateway.sip.config import SipConfig
from gateway.sip.endpoint import SipEndpoint
from gateway.sip.events import Outgoing, SipEvent
from gateway.sip.timers import SipTimers

Address = tuple[str, int]


@dataclass(frozen=True, kw_only=True)
class Delivery:
    source: Address
    destination: Address
    start_line: str
    dropped: bool
    data: bytes


def start_line(data: bytes) -> str:
    return data.split(b"\r\n", 1)[0].decode()


@dataclass
class Net:
    transport: str = "udp"
    now_ms: int = 0
    endpoints: dict[Address, SipEndpoint] = field(default_factory=dict)
    received: dict[Address, list[SipEvent]] = field(default_factory=dict)
    log: list[Delivery] = field(default_factory=list)
    drop: Callable[[Address, Outgoing], bool] = lambda source, out: False

    @property
    def now(self) -> float:
        return self.now_ms / 1000

    def add(self, port: int, **config: object) -> SipEndpoint:
        options: dict[str, object] = {"local_host": "127.0.0.1", "local_port": port, "timers": SipTimers()}
        options.update(config)
        endpoint = SipEndpoint(SipConfig(**options), rng=random.Random(port))  # type: ignore[arg-type]
        address = ("127.0.0.1", port)
        self.endpoints[address] = endpoint
        self.received[address] = []
        return endpoint

    def address_of(self, endpoint: SipEndpoint) -> Address:
        return next(address for address, ep in self.endpoints.items() if ep is endpoint)

    def events(self, endpoint: SipEndpoint) -> list[SipEvent]:
        self.pump()
        return self.received[self.address_of(endpoint)]

    def of_type(self, endpoint: SipEndpoint, kind: type) -> list[SipEvent]:
        return [event for event in self.events(endpoint) if isinstance(event, kind)]

    def pump(self) -> None:
        for _ in range(10_000):
            moved = False
            for address, endpoint in list(self.endpoints.items()):
                self.received[address].extend(endpoint.events())
                for out in endpoint.datagrams():
                    moved = True
                    dropped = self.drop(address, out)
                    self.log.append(
                        Delivery(
                            source=address,
                            destination=out.destination,
                            start_line=start_line(out.data),
                            dropped=dropped,
                            data=out.data,
                        )
                    )
                    target = self.endpoints.get(out.destination)
                    if not dropped and target is not None:
                        target.receive(out.data, address, transport=out.transport, now=self.now)
            if not moved:
                for address, endpoint in self.endpoints.items():
                    self.received[address].extend(endpoint.events())
                return
        raise AssertionError("message storm: the network never went quiet")

    def advance(self, ms: int) -> None:
        """Move the clock forward by `ms`, firing every deadline in order on the way."""
        target = self.now_ms + ms
        self.pump()
        while True:
            deadlines = [d for ep in self.endpoints.values() if (d := ep.next_deadline()) is not None]
            due = min(deadlines) if deadlines else None
            if due is None or due * 1000 > target:
                break
            self.now_ms = max(self.now_ms, int(-(-due * 1000 // 1)))  # ceil to the next whole ms
            if self.now < due:  # due * 1000 rounded down to a whole number in floating point
                self.now_ms += 1
            for endpoint in self.endpoints.values():
                endpoint.handle_timers(self.now)
            self.pump()
        self.now_ms = target
        for endpoint in self.endpoints.values():
            endpoint.handle_timers(self.now)
        self.pump()

    def lines(self, *, source: Address | None = None, include_dropped: bool = True) -> list[str]:
        return [
            d.start_line
            for d in self.log
            if (source is None or d.source == source) and (include_dropped or not d.dropped)
        ]


@dataclass
class DropFirst:
    """Drop the first `count` datagrams whose start line begins with `prefix` (from `source`, if set)."""

    prefix: str
    count: int
    source: Address | None = None
    dropped: int = 0

    def __call__(self, source: Address, out: Outgoing) -> bool:
        if self.source is not None and source != self.source:
            return False
        if self.dropped < self.count and start_line(out.data).startswith(self.prefix):
            self.dropped += 1
            return True
        return False


# --- a minimal digest pair implementing the core's Authenticator / ClientCredentials protocols ---------


def _md5(text: str) -> str:
    return hashlib.md5(text.encode()).hexdigest()


def _params(value: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in value.removeprefix("Digest").split(","):
        name, _, raw = part.strip().partition("=")
        out[name.strip().lower()] = raw.strip().strip('"')
    return out


@dataclass
class FakeAuthenticator:
    realm: str
    username: str
    password: str
    issued: list[str] = field(default_factory=list)

    def challenge(self, *, now: float) -> str:
        nonce = f"n{len(self.issued)}x{int(now * 1000)}"
        self.issued.append(nonce)
        return f'Digest realm="{self.realm}", nonce="{nonce}", qop="auth", algorithm=MD5'

    def verify(self, *, authorization: str, method: str, uri: str, body: bytes, now: float) -> AuthCheck:
        p = _params(authorization)
        user = p.get("username")
        if p.get("nonce") not in self.issued or user != self.username or p.get("uri") != uri:
            return AuthCheck(ok=False, username=user)
        ha1 = _md5(f"{self.username}:{self.realm}:{self.password}")
        ha2 = _md5(f"{method}:{p.get('uri', '')}")
        expected = _md5(f"{ha1}:{p['nonce']}:{p.get('nc', '')}:{p.get('cnonce', '')}:auth:{ha2}")
        return AuthCheck(ok=p.get("response") == expected, username=user)


@dataclass
class FakeCredentials:
    username: str
    password: str

    def authorization(self, *, challenge: str, method: str, uri: str, body: bytes) -> str | None:
        p = _params(challenge)
        ha1 = _md5(f"{self.username}:{p['realm']}:{self.password}")
        ha2 = _md5(f"{method}:{uri}")
        nc, cnonce = "00000001", "c0ffee"
        response = _md5(f"{ha1}:{p['nonce']}:{nc}:{cnonce}:auth:{ha2}")
        return (
            f'Digest username="{self.username}", realm="{p["realm"]}", nonce="{p["nonce"]}", uri="{uri}", '
            f'response="{response}", qop=auth, nc={nc}, cnonce="{cnonce}", algorithm=MD5'
        )
