"""SIP digest authentication (RFC 3261 §22, RFC 2617 §3, RFC 7616, RFC 8760): both ends, sans-I/O.

Owns: parsing and writing ``WWW-Authenticate``/``Proxy-Authenticate`` challenges and ``Authorization``/
``Proxy-Authorization`` credentials, the response computation for MD5, MD5-sess, SHA-256 and SHA-256-sess
with ``qop=auth`` or the legacy RFC 2069 form without qop, a server-side :class:`DigestChallenger`, and the
client-side :func:`authorization` for trunks that challenge our outbound calls with 401/407.

Why it is shaped this way:

* Nonces are stateless: ``base64url(body || HMAC-SHA256(secret, realm || body)[:16])`` with
  ``body = issued_at_ms || algorithm || salt``. Any worker holding the secret can check them, nothing is
  stored per challenge, the age comes from the nonce itself, and a nonce offered with SHA-256 cannot be
  answered with MD5 (no downgrade across the RFC 8760 challenges). The caller passes ``now`` and the random
  ``salt``: this module reads no clock and no entropy.
* RFC 2617 §3.2.1: ``stale=true`` is only answered when the response digest was right but the nonce too old,
  so a client with a wrong password is never told to silently retry.
* RFC 7616 §3.4: a nonce count seen before within a nonce is a replay. We remember, per nonce, the
  highest count and a 64-count window below it (the IPsec anti-replay shape, RFC 4303 §3.4.3) so UDP reordering
  still passes. The table is bounded: evicting an entry raises a watermark and any untracked nonce issued at
  or before it is answered stale (the client re-authenticates with a fresh nonce) instead of being replayable.
* Header values use RFC 3261 §25 auth-params: quoted strings with backslash escapes may hold commas.

Errors: :class:`DigestError` (a :class:`~gateway.sip.errors.RemoteProtocolError`, 400) for an unreadable or
unusable header. The server side never raises for the peer's mistakes: :meth:`DigestChallenger.verify`
returns a :class:`DigestVerdict`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from .errors import RemoteProtocolError

Algorithm = Literal["MD5", "MD5-sess", "SHA-256", "SHA-256-sess"]
ALGORITHMS: tuple[Algorithm, ...] = ("MD5", "MD5-sess", "SHA-256", "SHA-256-sess")
_BY_LOWER: dict[str, Algorithm] = {a.lower(): a for a in ALGORITHMS}
_HASH = {"MD5": "md5", "SHA-256": "sha256"}
_HEX_LENGTH = {"MD5": 32, "SHA-256": 64}
_MAX_HEADER = 8192
_TOKEN_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.!%*_+`'~")
_FOLD = re.compile(r"\r?\n[ \t]+")
_NC = re.compile(r"^[0-9a-fA-F]{8}$")
_MAC_BYTES, _TIME_BYTES = 16, 8
_REPLAY_WINDOW = 64
_CLOCK_SKEW_S = 2.0  # another worker's clock may run slightly ahead of ours


class DigestError(RemoteProtocolError):
    """A challenge or credentials header is malformed or asks for something we do not support."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"digest: {reason}", status_code=400)


def _base(algorithm: Algorithm) -> str:
    return algorithm.removesuffix("-sess")


def _h(algorithm: Algorithm, text: str) -> str:
    return hashlib.new(_HASH[_base(algorithm)], text.encode("utf-8")).hexdigest()


def _algorithm(value: str | None) -> Algorithm:
    if value is None:
        return "MD5"  # RFC 2617 §3.2.1: absent means MD5
    found = _BY_LOWER.get(value.lower())
    if found is None:
        raise DigestError(f"unsupported algorithm {value[:40]!r}")
    return found


# --------------------------------------------------------------------------------------- header grammar


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_auth_params(value: str) -> tuple[str, dict[str, str]]:
    """Split ``Digest a=b, c="d, \\"e\\""`` into the scheme and lower-cased parameter names with values."""
    if len(value) > _MAX_HEADER:
        raise DigestError(f"header longer than {_MAX_HEADER} characters")
    value = _FOLD.sub(" ", value)  # RFC 3261 §7.3.1 line folding, should it reach us unfolded
    if any((ord(ch) < 0x20 and ch != "\t") or ord(ch) == 0x7F for ch in value):
        raise DigestError("control character in header")
    text = value.strip()
    end = 0
    while end < len(text) and text[end] in _TOKEN_CHARS:
        end += 1
    scheme = text[:end]
    if not scheme or (end < len(text) and text[end] not in " \t"):
        raise DigestError(f"expected an auth scheme at the start of {text[:40]!r}")
    params: dict[str, str] = {}
    i, n = end, len(text)
    while True:
        while i < n and text[i] in " \t,":  # RFC 7230 #rule: empty list elements are allowed
            i += 1
        if i >= n:
            break
        start = i
        while i < n and text[i] in _TOKEN_CHARS:
            i += 1
        name = text[start:i].lower()
        if not name:
            raise DigestError(f"expected a parameter name at offset {start}")
        while i < n and text[i] in " \t":
            i += 1
        if i >= n or text[i] != "=":
            raise DigestError(f"parameter {name!r} has no '='")
        i += 1
        while i < n and text[i] in " \t":
            i += 1
        if i < n and text[i] == '"':
            chars: list[str] = []
            i += 1
            while True:
                if i >= n:
                    raise DigestError(f"unterminated quoted string in {name!r}")
                ch = text[i]
                if ch == '"':
                    i += 1
                    break
                if ch == "\\":
                    if i + 1 >= n:
                        raise DigestError(f"dangling backslash in {name!r}")
                    ch = text[i + 1]
                    i += 1
                chars.append(ch)
                i += 1
            param_value = "".join(chars)
        else:
            start = i
            while i < n and text[i] not in ' \t,"':
                i += 1
            param_value = text[start:i]
            if not param_value:
                raise DigestError(f"parameter {name!r} has an empty value")
        while i < n and text[i] in " \t":
            i += 1
        if i < n and text[i] != ",":
            raise DigestError(f"expected ',' after parameter {name!r}")
        if name in params:
            raise DigestError(f"duplicate parameter {name!r}")
        params[name] = param_value
    return scheme, params


def _digest_params(value: str) -> dict[str, str]:
    scheme, params = parse_auth_params(value)
    if scheme.lower() != "digest":
        raise DigestError(f"unsupported auth scheme {scheme[:20]!r}")
    return params


def _required(params: dict[str, str], name: str) -> str:
    value = params.get(name)
    if value is None:
        raise DigestError(f"missing {name}")
    return value


# ------------------------------------------------------------------------------------------ value types


@dataclass(frozen=True, slots=True, kw_only=True)
class DigestChallenge:
    """One ``WWW-Authenticate``/``Proxy-Authenticate`` digest challenge."""

    realm: str
    nonce: str
    algorithm: Algorithm = "MD5"
    qop: tuple[str, ...] = ()  # offered qop values, e.g. ("auth",); empty = legacy RFC 2069
    opaque: str | None = None
    stale: bool = False
    domain: str | None = None

    def to_header_value(self) -> str:
        parts = [f"realm={_quote(self.realm)}"]
        if self.domain is not None:
            parts.append(f"domain={_quote(self.domain)}")
        parts.append(f"nonce={_quote(self.nonce)}")
        if self.opaque is not None:
            parts.append(f"opaque={_quote(self.opaque)}")
        if self.stale:
            parts.append("stale=TRUE")
        parts.append(f"algorithm={self.algorithm}")
        if self.qop:
            parts.append(f"qop={_quote(','.join(self.qop))}")
        return "Digest " + ", ".join(parts)


@dataclass(frozen=True, slots=True, kw_only=True)
class DigestCredentials:
    """One ``Authorization``/``Proxy-Authorization`` digest answer. ``nc`` is the 8-hex-digit count."""

    username: str
    realm: str
    nonce: str
    uri: str
    response: str
    algorithm: Algorithm = "MD5"
    qop: str | None = None
    nc: str | None = None
    cnonce: str | None = None
    opaque: str | None = None

    def to_header_value(self) -> str:
        parts = [
            f"username={_quote(self.username)}",
            f"realm={_quote(self.realm)}",
            f"nonce={_quote(self.nonce)}",
            f"uri={_quote(self.uri)}",
            f"response={_quote(self.response)}",
            f"algorithm={self.algorithm}",
        ]
        if self.cnonce is not None:
            parts.append(f"cnonce={_quote(self.cnonce)}")
        if self.opaque is not None:
            parts.append(f"opaque={_quote(self.opaque)}")
        if self.qop is not None:
            parts.append(f"qop={self.qop}")  # a token here, unlike the challenge (RFC 3261 §25.1 message-qop)
        if self.nc is not None:
            parts.append(f"nc={self.nc}")
        return "Digest " + ", ".join(parts)


def parse_challenge(header_value: str) -> DigestChallenge:
    """Parse one challenge header value; :class:`DigestError` when malformed or not usable by us."""
    params = _digest_params(header_value)
    qop = tuple(q.strip().lower() for q in params.get("qop", "").split(",") if q.strip())
    stale = params.get("stale", "false").lower()
    if stale not in ("true", "false"):
        raise DigestError(f"bad stale value {stale[:20]!r}")
    return DigestChallenge(
        realm=_required(params, "realm"),
        nonce=_required(params, "nonce"),
        algorithm=_algorithm(params.get("algorithm")),
        qop=qop,
        opaque=params.get("opaque"),
        stale=stale == "true",
        domain=params.get("domain"),
    )


def select_challenge(header_values: Iterable[str]) -> DigestChallenge:
    """RFC 8760: of several challenges, take the strongest algorithm we support (SHA-256 over MD5)."""
    usable: list[DigestChallenge] = []
    errors: list[str] = []
    for value in header_values:
        try:
            usable.append(parse_challenge(value))
        except DigestError as exc:
            errors.append(str(exc))
    if not usable:
        raise DigestError("no usable challenge" + (f" ({'; '.join(errors)})" if errors else ""))
    return max(usable, key=lambda c: _base(c.algorithm) == "SHA-256")


def parse_credentials(header_value: str) -> DigestCredentials:
    """Parse an ``Authorization`` value; checks presence and shape, not correctness."""
    params = _digest_params(header_value)
    algorithm = _algorithm(params.get("algorithm"))
    response = _required(params, "response").lower()
    if len(response) != _HEX_LENGTH[_base(algorithm)] or any(ch not in "0123456789abcdef" for ch in response):
        raise DigestError(f"response is not a {algorithm} hex digest")
    qop = params.get("qop")
    nc = cnonce = None
    if qop is not None:
        qop = qop.lower()
        if any(ch not in _TOKEN_CHARS for ch in qop):
            raise DigestError(f"qop must be a token, got {qop[:20]!r}")
        nc, cnonce = _required(params, "nc"), _required(params, "cnonce")
        if not _NC.match(nc):
            raise DigestError(f"nc must be 8 hex digits, got {nc[:20]!r}")
        if int(nc, 16) == 0:
            raise DigestError("nc counts from 00000001")
    elif algorithm.endswith("-sess"):
        cnonce = _required(params, "cnonce")
    return DigestCredentials(
        username=_required(params, "username"),
        realm=_required(params, "realm"),
        nonce=_required(params, "nonce"),
        uri=_required(params, "uri"),
        response=response,
        algorithm=algorithm,
        qop=qop,
        nc=nc,
        cnonce=cnonce,
        opaque=params.get("opaque"),
    )


# ---------------------------------------------------------------------------------------- computation


@dataclass(frozen=True, slots=True, kw_only=True)
class Ha1:
    """A stored ``H(username:realm:password)`` for one hash (``MD5`` or ``SHA-256``), instead of a password."""

    hex: str
    algorithm: Literal["MD5", "SHA-256"] = "MD5"


def ha1_of(algorithm: Literal["MD5", "SHA-256"], username: str, realm: str, password: str) -> Ha1:
    """What to store instead of a password (RFC 2617 §3.2.2.2 A1)."""
    return Ha1(hex=_h(algorithm, f"{username}:{realm}:{password}"), algorithm=algorithm)


def compute_response(
    *,
    algorithm: Algorithm,
    secret: str | Ha1,
    username: str,
    realm: str,
    method: str,
    uri: str,
    nonce: str,
    qop: str | None,
    nc: str | None,
    cnonce: str | None,
) -> str | None:
    """The request-digest (RFC 7616 §3.4.1); None when a stored HA1 is for another hash than ``algorithm``."""
    if isinstance(secret, Ha1):
        if secret.algorithm != _base(algorithm):
            return None
        ha1 = secret.hex.lower()
    else:
        ha1 = _h(algorithm, f"{username}:{realm}:{secret}")
    if algorithm.endswith("-sess"):
        ha1 = _h(algorithm, f"{ha1}:{nonce}:{cnonce or ''}")
    ha2 = _h(algorithm, f"{method}:{uri}")
    if qop is None:  # RFC 2069 compatibility
        return _h(algorithm, f"{ha1}:{nonce}:{ha2}")
    return _h(algorithm, f"{ha1}:{nonce}:{nc}:{cnonce}:{qop}:{ha2}")


def authorization(
    challenge: DigestChallenge,
    *,
    method: str,
    uri: str,
    username: str,
    password: str,
    cnonce: str,
    nc: int,
) -> str:
    """The ``Authorization``/``Proxy-Authorization`` value answering ``challenge`` for one request.

    ``cnonce`` is fresh randomness from the caller; ``nc`` counts requests made with this nonce, from 1.
    """
    if not 1 <= nc <= 0xFFFFFFFF:
        raise ValueError(f"nc must be in 1..2**32-1, got {nc}")
    if not cnonce or '"' in cnonce or "\\" in cnonce:
        raise ValueError("cnonce must be non-empty and free of quotes and backslashes")
    if "auth" in challenge.qop:
        qop: str | None = "auth"
        nc_text: str | None = f"{nc:08x}"
    elif not challenge.qop:
        qop = nc_text = None
    else:
        raise DigestError(f"challenge offers only unsupported qop {','.join(challenge.qop)[:40]!r}")
    use_cnonce = qop is not None or challenge.algorithm.endswith("-sess")
    response = compute_response(
        algorithm=challenge.algorithm,
        secret=password,
        username=username,
        realm=challenge.realm,
        method=method,
        uri=uri,
        nonce=challenge.nonce,
        qop=qop,
        nc=nc_text,
        cnonce=cnonce if use_cnonce else None,
    )
    assert response is not None  # a password always yields a digest
    credentials = DigestCredentials(
        username=username,
        realm=challenge.realm,
        nonce=challenge.nonce,
        uri=uri,
        response=response,
        algorithm=challenge.algorithm,
        qop=qop,
        nc=nc_text,
        cnonce=cnonce if use_cnonce else None,
        opaque=challenge.opaque,
    )
    return credentials.to_header_value()


# --------------------------------------------------------------------------------------------- server


class DigestOutcome(StrEnum):
    OK = "ok"
    STALE = "stale"  # right credentials, old nonce: challenge again with stale=TRUE
    BAD_CREDENTIALS = "bad_credentials"  # challenge again (or 403 after too many tries)
    MALFORMED = "malformed"  # unreadable header: 400, or challenge again


@dataclass(frozen=True, slots=True, kw_only=True)
class DigestVerdict:
    outcome: DigestOutcome
    reason: str
    username: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome is DigestOutcome.OK


CredentialLookup = Callable[[str], str | Ha1 | None]  # username -> password, stored HA1, or unknown


@dataclass(slots=True)
class _Window:
    issued_at: float
    highest: int
    seen: int  # bit k set: count (highest - k) was used


class _NonceCounts:
    """Which nonce counts were used, per nonce, in bounded memory (see the module docstring)."""

    def __init__(self, capacity: int, ttl_s: float) -> None:
        self._capacity, self._ttl_s = capacity, ttl_s
        self._windows: OrderedDict[str, _Window] = OrderedDict()
        self._evicted_up_to = float("-inf")

    def __len__(self) -> int:
        return len(self._windows)

    def check_and_record(self, nonce: str, issued_at: float, nc: int, now: float) -> Literal["ok", "replay", "lost"]:
        window = self._windows.get(nonce)
        if window is None:
            if issued_at <= self._evicted_up_to:
                return "lost"
            self._windows[nonce] = _Window(issued_at=issued_at, highest=nc, seen=1)
            self._evict(now)
            return "ok"
        self._windows.move_to_end(nonce)
        if nc > window.highest:
            shift = nc - window.highest
            window.seen = ((window.seen << shift) | 1) & ((1 << _REPLAY_WINDOW) - 1) if shift < _REPLAY_WINDOW else 1
            window.highest = nc
            return "ok"
        offset = window.highest - nc
        if offset >= _REPLAY_WINDOW or window.seen >> offset & 1:
            return "replay"
        window.seen |= 1 << offset
        return "ok"

    def _evict(self, now: float) -> None:
        while len(self._windows) > self._capacity:
            _, window = self._windows.popitem(last=False)
            # Nonces issued before an already-expired one are expired too; only live ones need the watermark.
            if now - window.issued_at <= self._ttl_s:
                self._evicted_up_to = max(self._evicted_up_to, window.issued_at)


class DigestChallenger:
    """Server side: issues challenges and checks credentials against them (UAS 401 or proxy 407)."""

    def __init__(
        self,
        *,
        realm: str,
        credentials: CredentialLookup,
        nonce_secret: bytes,
        nonce_ttl_s: float = 300.0,
        algorithms: tuple[Algorithm, ...] = ("MD5",),
        legacy_no_qop: bool = False,
        max_tracked_nonces: int = 10_000,
    ) -> None:
        if len(nonce_secret) < 16:
            raise ValueError("nonce_secret must be at least 16 bytes")
        if not algorithms or any(a not in ALGORITHMS for a in algorithms):
            raise ValueError(f"algorithms must be a non-empty subset of {ALGORITHMS}")
        if nonce_ttl_s <= 0 or max_tracked_nonces < 1:
            raise ValueError("nonce_ttl_s and max_tracked_nonces must be positive")
        self.realm = realm
        self.algorithms = algorithms
        self.legacy_no_qop = legacy_no_qop
        self._credentials = credentials
        self._secret = nonce_secret
        self._ttl_s = nonce_ttl_s
        self._counts = _NonceCounts(max_tracked_nonces, nonce_ttl_s)

    # -- nonces

    def _mac(self, body: bytes) -> bytes:
        message = b"sip-digest-nonce\x00" + self.realm.encode("utf-8") + b"\x00" + body
        return hmac.new(self._secret, message, hashlib.sha256).digest()[:_MAC_BYTES]

    def make_nonce(self, now: float, salt: bytes, algorithm: Algorithm) -> str:
        """A signed nonce carrying its issue time and the algorithm it was offered with (no downgrade)."""
        if len(salt) < 8:
            raise ValueError("salt must be at least 8 random bytes")
        body = max(0, int(now * 1000)).to_bytes(_TIME_BYTES, "big") + bytes([ALGORITHMS.index(algorithm)]) + salt
        return base64.urlsafe_b64encode(body + self._mac(body)).rstrip(b"=").decode("ascii")

    def read_nonce(self, nonce: str) -> tuple[float, Algorithm] | None:
        """When we issued ``nonce`` (seconds) and for which algorithm, or None when it is not one of ours."""
        if len(nonce) > 200 or not nonce.isascii():
            return None
        try:
            raw = base64.urlsafe_b64decode(nonce + "=" * (-len(nonce) % 4))
        except (binascii.Error, ValueError):
            return None
        if len(raw) < _TIME_BYTES + 1 + 8 + _MAC_BYTES:
            return None
        body, mac = raw[:-_MAC_BYTES], raw[-_MAC_BYTES:]
        if not hmac.compare_digest(mac, self._mac(body)) or body[_TIME_BYTES] >= len(ALGORITHMS):
            return None
        return int.from_bytes(body[:_TIME_BYTES], "big") / 1000, ALGORITHMS[body[_TIME_BYTES]]

    # -- challenges

    def challenge(self, now: float, *, salt: bytes, stale: bool = False, algorithm: Algorithm | None = None) -> str:
        """One ``WWW-Authenticate`` (401) / ``Proxy-Authenticate`` (407) header value."""
        chosen = algorithm or self.algorithms[0]
        if chosen not in self.algorithms:
            raise ValueError(f"algorithm {chosen} is not configured")
        return DigestChallenge(
            realm=self.realm,
            nonce=self.make_nonce(now, salt, chosen),
            algorithm=chosen,
            qop=() if self.legacy_no_qop else ("auth",),
            stale=stale,
        ).to_header_value()

    def challenges(self, now: float, *, salt: bytes, stale: bool = False) -> tuple[str, ...]:
        """RFC 8760: one header value per configured algorithm, most preferred first."""
        return tuple(self.challenge(now, salt=salt, stale=stale, algorithm=a) for a in self.algorithms)

    # -- verification

    def verify(
        self, method: str, authorization_header_value: str, now: float, *, uri: str | None = None
    ) -> DigestVerdict:
        """Check credentials for a request. ``uri``, when given, must equal the digest ``uri`` parameter."""
        try:
            creds = parse_credentials(authorization_header_value)
        except DigestError as exc:
            return DigestVerdict(outcome=DigestOutcome.MALFORMED, reason=exc.reason)
        user = creds.username

        def verdict(outcome: DigestOutcome, reason: str) -> DigestVerdict:
            return DigestVerdict(outcome=outcome, reason=reason, username=user)

        if creds.qop is None and not self.legacy_no_qop:
            return verdict(DigestOutcome.MALFORMED, "qop=auth is required")
        if creds.qop not in (None, "auth"):
            return verdict(DigestOutcome.MALFORMED, f"unsupported qop {creds.qop[:20]!r}")
        if creds.realm != self.realm:
            return verdict(DigestOutcome.BAD_CREDENTIALS, "realm does not match")
        if creds.algorithm not in self.algorithms:
            return verdict(DigestOutcome.BAD_CREDENTIALS, f"algorithm {creds.algorithm} was not offered")
        if uri is not None and creds.uri != uri:
            return verdict(DigestOutcome.BAD_CREDENTIALS, "digest uri does not match the request-URI")
        issued = self.read_nonce(creds.nonce)
        if issued is None:
            return verdict(DigestOutcome.BAD_CREDENTIALS, "nonce was not issued here")
        issued_at, nonce_algorithm = issued
        if creds.algorithm != nonce_algorithm:
            return verdict(DigestOutcome.BAD_CREDENTIALS, f"nonce was issued for {nonce_algorithm}")
        secret = self._credentials(user)
        expected = None
        if secret is not None:
            expected = compute_response(
                algorithm=creds.algorithm,
                secret=secret,
                username=user,
                realm=self.realm,
                method=method,
                uri=creds.uri,
                nonce=creds.nonce,
                qop=creds.qop,
                nc=creds.nc,
                cnonce=creds.cnonce,
            )
        # Unknown user and wrong password read the same to the peer: no account enumeration.
        if expected is None or not hmac.compare_digest(expected, creds.response):
            return verdict(DigestOutcome.BAD_CREDENTIALS, "wrong credentials")
        if not -_CLOCK_SKEW_S <= now - issued_at <= self._ttl_s:
            return verdict(DigestOutcome.STALE, "nonce expired")
        if creds.nc is not None:
            seen = self._counts.check_and_record(creds.nonce, issued_at, int(creds.nc, 16), now)
            if seen == "replay":
                return verdict(DigestOutcome.BAD_CREDENTIALS, f"nonce count {creds.nc} replayed")
            if seen == "lost":
                return verdict(DigestOutcome.STALE, "nonce no longer tracked")
        return verdict(DigestOutcome.OK, "ok")

    @property
    def tracked_nonces(self) -> int:
        return len(self._counts)
