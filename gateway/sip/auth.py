"""The seams through which the SIP core uses digest authentication (RFC 3261 §22, RFC 7616).

Owns: two small Protocols, so the core never computes or parses digests itself:

- `Authenticator` (server side, used by the inbound policy): `challenge()` gives the value of a
  WWW-Authenticate header (qop=auth), `verify()` checks an Authorization header value for a request.
- `ClientCredentials` (client side, used by `SipEndpoint.invite`): `authorization()` answers a
  WWW-Authenticate / Proxy-Authenticate challenge with an Authorization header value.

gateway/sip/digest.py provides the digest implementations; any object with these methods fits.
"""

from __future__ import annotations

from typing import Protocol


class Authenticator(Protocol):
    """Server-side digest: issue challenges and verify answers to them."""

    def challenge(self, *, now: float) -> str:
        """The value of a WWW-Authenticate header for a 401 (fresh nonce, qop=auth)."""
        ...

    def verify(self, *, authorization: str, method: str, body: bytes, now: float) -> bool:
        """Whether the Authorization header value answers one of our challenges for this request."""
        ...


class ClientCredentials(Protocol):
    """Client-side digest: compute the Authorization answer to a challenge."""

    def authorization(self, *, challenge: str, method: str, uri: str, body: bytes) -> str | None:
        """The Authorization (or Proxy-Authorization) value, or None if the challenge cannot be met."""
        ...
