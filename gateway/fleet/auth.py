"""Bearer-token checks shared by the control plane's APIs and a worker's internal command API.

The comparison is constant-time (hmac.compare_digest on bytes) so the token cannot be guessed byte by
byte from response timing. An empty configured token means "no authentication" — allowed only when the
process listens on loopback, which the process entry points enforce.
"""

from __future__ import annotations

import hmac


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, or None."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def token_matches(presented: str | None, expected: str | None) -> bool:
    """True when no token is configured, or ``presented`` equals it (constant-time)."""
    if not expected:
        return True
    if presented is None:
        return False
    return hmac.compare_digest(presented.encode("utf-8"), expected.encode("utf-8"))
