"""Inbound request policy: who may talk to the gateway, how fast, and with which credentials.

Owns: `InboundPolicy.check`, applied to every request before any transaction state is created:

    1. rate limit   per source IP token bucket (`RateLimit`); an empty bucket -> DROP (silently, counted),
                    since answering a flood only amplifies it
    2. allow-list   source IP outside `allow_cidrs` -> REJECT 403
    3. scanners     out-of-dialog requests whose User-Agent names a known scanner (`scanner_agents`) -> DROP
    4. lockout      out-of-dialog requests from a source blocked after failed authentications -> DROP
                    (lockout.py: per source and per username, growing blocks, an allow-list never blocked)
    5. digest       initial INVITE (no To tag) while an `Authenticator` is configured: no or wrong
                    Authorization -> CHALLENGE (401 with WWW-Authenticate, RFC 3261 §22.2); a wrong one is
                    counted by the lockout, and the answer that starts a block is dropped instead; with
                    `SourceTrunks` the source's trunk picks the authenticator (trunk_auth.py), and a source
                    of no trunk gets the configured one, or 403 with `reject_unmatched`

ACK is never rejected (it has no response, §17.1.1.3) and CANCEL is not challenged (§22.1: it cannot be
resubmitted with credentials), but both still count against the rate limit and the allow-list.
"""

from __future__ import annotations

import enum
import ipaddress
from collections import OrderedDict
from dataclasses import dataclass

from .auth import Authenticator
from .config import RateLimit
from .events import AuthenticationFailed, SipEvent, SourceBlocked
from .lockout import AuthLockout, LockoutConfig
from .message import SipRequest
from .trunk_auth import SourceTrunks


class Verdict(enum.Enum):
    ALLOW = "allow"
    DROP = "drop"
    REJECT = "reject"
    CHALLENGE = "challenge"


@dataclass(frozen=True, kw_only=True)
class Decision:
    verdict: Verdict
    status: int = 0
    headers: tuple[tuple[str, str], ...] = ()
    counter: str = ""  # the SipStats field a DROP is counted in (empty: policy_dropped)
    events: tuple[SipEvent, ...] = ()


_ALLOW = Decision(verdict=Verdict.ALLOW)
_DROP = Decision(verdict=Verdict.DROP)
_BLOCKED = Decision(verdict=Verdict.DROP, counter="blocked_dropped")
_SCANNER = Decision(verdict=Verdict.DROP, counter="scanner_dropped")


class TokenBucket:
    """Classic token bucket driven by the caller's clock."""

    __slots__ = ("_burst", "_rate", "_stamp", "_tokens")

    def __init__(self, *, rate: float, burst: int, now: float) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._tokens = float(burst)
        self._stamp = now

    def take(self, now: float) -> bool:
        if now > self._stamp:
            self._tokens = min(self._burst, self._tokens + (now - self._stamp) * self._rate)
            self._stamp = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class InboundPolicy:
    def __init__(
        self,
        *,
        allow_cidrs: tuple[str, ...] = (),
        rate_limit: RateLimit | None = None,
        authenticator: Authenticator | None = None,
        lockout: LockoutConfig | None = None,
        scanner_agents: tuple[str, ...] = (),
        trunks: SourceTrunks | None = None,
    ) -> None:
        self._networks = [ipaddress.ip_network(cidr, strict=False) for cidr in allow_cidrs]
        self._rate_limit = rate_limit
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._authenticator = authenticator
        self._lockout = AuthLockout(lockout) if lockout is not None else None
        self._scanner_agents = tuple(agent.lower() for agent in scanner_agents if agent)
        self._trunks = trunks

    def _scanner(self, request: SipRequest) -> bool:
        if not self._scanner_agents:
            return False
        agent = (request.headers.get("User-Agent") or "").lower()
        return bool(agent) and any(name in agent for name in self._scanner_agents)

    def source_allowed(self, host: str) -> bool:
        if not self._networks:
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in network for network in self._networks)

    def _within_rate(self, host: str, now: float) -> bool:
        limit = self._rate_limit
        if limit is None:
            return True
        bucket = self._buckets.get(host)
        if bucket is None:
            bucket = TokenBucket(rate=limit.per_second, burst=limit.burst, now=now)
            self._buckets[host] = bucket
            while len(self._buckets) > limit.max_sources:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(host)
        return bucket.take(now)

    def check(self, request: SipRequest, source: tuple[str, int], now: float, *, transport: str = "udp") -> Decision:
        host = source[0]
        if not self._within_rate(host, now):
            return _DROP
        if not self.source_allowed(host):
            return _DROP if request.method == "ACK" else Decision(verdict=Verdict.REJECT, status=403)
        if request.to.tag is not None:
            return _ALLOW  # within a dialog: established calls are never cut by the edge
        if self._scanner(request):
            return _SCANNER
        lockout = self._lockout
        if lockout is not None and lockout.source_blocked(host, now):
            return _BLOCKED
        if request.method != "INVITE":
            return _ALLOW
        authenticator = self._authenticator
        if self._trunks is not None:
            match = self._trunks.match(host, authenticator)
            if match.trunk is None and self._trunks.reject_unmatched:
                return Decision(verdict=Verdict.REJECT, status=403)
            authenticator = match.authenticator
        if authenticator is None:
            return _ALLOW
        authorization = request.headers.get("Authorization")
        if not authorization:
            return self._challenge(authenticator, now)
        check = authenticator.verify(
            authorization=authorization, method=request.method, uri=str(request.uri), body=request.body, now=now
        )
        if lockout is None:
            return _ALLOW if check.ok else self._challenge(authenticator, now)
        if check.username and lockout.user_blocked(check.username, now) and not lockout.never_blocked(host):
            return _BLOCKED
        if check.ok:
            lockout.succeeded(host)
            return _ALLOW
        if check.stale:
            return self._challenge(authenticator, now)
        failed = AuthenticationFailed(
            source=source,
            transport=transport,
            username=check.username,
            method=request.method,
            user_agent=request.headers.get("User-Agent"),
        )
        blocks = tuple(
            SourceBlocked(scope=b.scope, key=b.key, failures=b.failures, block_s=b.block_s, transport=transport)
            for b in lockout.failed(host, check.username, now)
        )
        if lockout.source_blocked(host, now) or (check.username and lockout.user_blocked(check.username, now)):
            return Decision(verdict=Verdict.DROP, counter="blocked_dropped", events=(failed, *blocks))
        return Decision(
            verdict=Verdict.CHALLENGE,
            status=401,
            headers=(("WWW-Authenticate", authenticator.challenge(now=now)),),
            events=(failed,),
        )

    @staticmethod
    def _challenge(authenticator: Authenticator, now: float) -> Decision:
        challenge = authenticator.challenge(now=now)
        return Decision(verdict=Verdict.CHALLENGE, status=401, headers=(("WWW-Authenticate", challenge),))
