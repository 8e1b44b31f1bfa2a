"""Inbound request policy: who may talk to the gateway, how fast, and with which credentials.

Owns: `InboundPolicy.check`, applied to every request before any transaction state is created:

    1. rate limit   per source IP token bucket (`RateLimit`); an empty bucket -> DROP (silently, counted),
                    since answering a flood only amplifies it
    2. allow-list   source IP outside `allow_cidrs` -> REJECT 403
    3. digest       initial INVITE (no To tag) while an `Authenticator` is configured: no or wrong
                    Authorization -> CHALLENGE (401 with WWW-Authenticate, RFC 3261 §22.2)

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
from .message import SipRequest


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


_ALLOW = Decision(verdict=Verdict.ALLOW)
_DROP = Decision(verdict=Verdict.DROP)


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
    ) -> None:
        self._networks = [ipaddress.ip_network(cidr, strict=False) for cidr in allow_cidrs]
        self._rate_limit = rate_limit
        self._buckets: OrderedDict[str, TokenBucket] = OrderedDict()
        self._authenticator = authenticator

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

    def check(self, request: SipRequest, source: tuple[str, int], now: float) -> Decision:
        host = source[0]
        if not self._within_rate(host, now):
            return _DROP
        if not self.source_allowed(host):
            return _DROP if request.method == "ACK" else Decision(verdict=Verdict.REJECT, status=403)
        if self._authenticator is None or request.method != "INVITE" or request.to.tag is not None:
            return _ALLOW
        authorization = request.headers.get("Authorization")
        if authorization and self._authenticator.verify(
            authorization=authorization, method=request.method, uri=str(request.uri), body=request.body, now=now
        ):
            return _ALLOW
        challenge = self._authenticator.challenge(now=now)
        return Decision(verdict=Verdict.CHALLENGE, status=401, headers=(("WWW-Authenticate", challenge),))
