"""The seams through which the SIP core uses digest authentication (RFC 3261 §22, RFC 7616).

Owns: two small Protocols, so the core never computes or parses digests itself:

- `Authenticator` (server side, used by the inbound policy): `challenge()` gives the value of a
  WWW-Authenticate header (qop=auth), `verify()` checks an Authorization header value for a request.
- `ClientCredentials` (client side, used by `SipEndpoint.invite`): `authorization()` answers a
  WWW-Authenticate / Proxy-Authenticate challenge with an Authorization header value.

`DigestAuthenticator` and `DigestClientCredentials` adapt gateway/sip/digest.py to these Protocols; any
other object with these methods fits as well (tests use a small fake).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Protocol

from .digest import DigestChallenger, DigestError, DigestOutcome, parse_challenge
from .digest import authorization as digest_authorization


@dataclass(frozen=True, slots=True, kw_only=True)
class AuthCheck:
    """What `Authenticator.verify` found: ``ok``; the username the answer named, when readable (the lockout
    counts failures per user); ``stale``: the right password over an expired nonce (not a failure)."""

    ok: bool
    username: str | None = None
    stale: bool = False


class Authenticator(Protocol):
    """Server-side digest: issue challenges and verify answers to them."""

    def challenge(self, *, now: float) -> str:
        """The value of a WWW-Authenticate header for a 401 (fresh nonce, qop=auth)."""
        ...

    def verify(self, *, authorization: str, method: str, uri: str, body: bytes, now: float) -> AuthCheck:
        """Whether the Authorization value answers one of our challenges for this request (`uri` is the
        Request-URI, which the digest's uri parameter must equal)."""
        ...


class ClientCredentials(Protocol):
    """Client-side digest: compute the Authorization answer to a challenge."""

    def authorization(self, *, challenge: str, method: str, uri: str, body: bytes) -> str | None:
        """The Authorization (or Proxy-Authorization) value, or None if the challenge cannot be met."""
        ...


class DigestAuthenticator:
    """`Authenticator` over digest.py's `DigestChallenger` (stateless HMAC nonces, qop=auth, replay window).

    A stale nonce (right password, old nonce) is answered with `stale=true` in the next challenge, so the
    peer retries silently (RFC 2617 §3.2.1). `rng` supplies the nonce salt; pass a seeded one in tests."""

    def __init__(self, challenger: DigestChallenger, *, rng: random.Random | None = None) -> None:
        self._challenger = challenger
        self._rng = rng or random.SystemRandom()
        self._stale = False

    def challenge(self, *, now: float) -> str:
        stale, self._stale = self._stale, False
        return self._challenger.challenge(now, salt=self._rng.randbytes(16), stale=stale)

    def verify(self, *, authorization: str, method: str, uri: str, body: bytes, now: float) -> AuthCheck:
        verdict = self._challenger.verify(method, authorization, now, uri=uri)
        self._stale = verdict.outcome is DigestOutcome.STALE
        return AuthCheck(ok=verdict.ok, username=verdict.username, stale=self._stale)


class DigestClientCredentials:
    """`ClientCredentials` for a username/password, answering with digest.py's `authorization`."""

    def __init__(self, *, username: str, password: str, rng: random.Random | None = None) -> None:
        self._username = username
        self._password = password
        self._rng = rng or random.SystemRandom()

    def authorization(self, *, challenge: str, method: str, uri: str, body: bytes) -> str | None:
        try:
            parsed = parse_challenge(challenge)
            return digest_authorization(
                parsed,
                method=method,
                uri=uri,
                username=self._username,
                password=self._password,
                cnonce=f"{self._rng.getrandbits(64):016x}",
                nc=1,  # every retry answers a fresh challenge
            )
        except (DigestError, ValueError):
            return None
