"""Configuration of the SIP user-agent core: one frozen object, validated at construction.

Owns: `SipConfig` (addresses, transports, timers, limits, policy, session timers) and its small parts
`RateLimit` and `SessionTimerConfig`. The bind address is the glue's business; the core only needs the
address it advertises in Via and Contact (which differs from the bind address behind NAT or a balancer).
TLS (RFC 3261 §26, RFC 5630) is a transport name here like the others; certificates are the glue's.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field
from typing import Final, Literal

from .auth import Authenticator
from .errors import RemoteProtocolError, SipConfigError
from .lockout import LockoutConfig
from .message import SipLimits
from .timers import SipTimers
from .trunk_auth import SourceTrunks
from .uri import SipUri, parse_uri

Transport = str  # "udp" | "tcp" | "tls"
TRANSPORTS = ("udp", "tcp", "tls")
DEFAULT_TRANSPORTS = ("udp", "tcp")
DEFAULT_PORTS = {"udp": 5060, "tcp": 5060, "tls": 5061}  # RFC 3261 §19.1.2, §26.2.2; RFC 3263 §4.2


class _Configured(enum.Enum):
    PROXY = "the configured outbound proxy"


#: An out-of-dialog request (INVITE, REGISTER) goes through `SipConfig.outbound_proxy`; a trunk of its own
#: names its proxy (a URI) or None (straight to the Request-URI's host) instead.
CONFIGURED_PROXY: Final = _Configured.PROXY
ProxyChoice = str | None | Literal[_Configured.PROXY]


@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """Token bucket per source IP: `burst` requests at once, refilled at `per_second`."""

    per_second: float = 50.0
    burst: int = 100
    max_sources: int = 10_000  # buckets kept; beyond this the oldest are forgotten

    def __post_init__(self) -> None:
        if self.per_second <= 0 or self.burst < 1 or self.max_sources < 1:
            raise SipConfigError("RateLimit needs per_second > 0, burst >= 1, max_sources >= 1")


@dataclass(frozen=True, kw_only=True)
class SessionTimerConfig:
    """RFC 4028: the interval we ask for (Session-Expires) and the smallest we accept (Min-SE)."""

    enabled: bool = True
    session_expires: int = 1800
    min_se: int = 90

    def __post_init__(self) -> None:
        if self.min_se < 90 or self.session_expires < self.min_se:
            raise SipConfigError("session timers need min_se >= 90 (RFC 4028 §5) and session_expires >= min_se")


@dataclass(frozen=True, kw_only=True)
class SipConfig:
    """Everything a `SipEndpoint` needs. `advertised_*` default to `local_*` when None."""

    local_host: str = "127.0.0.1"
    local_port: int = 5060
    # SIP over TLS listens on its own port (RFC 3261 §26.2.2: 5061); Via and Contact of TLS messages name it.
    tls_port: int = 5061
    advertised_host: str | None = None
    advertised_port: int | None = None
    advertised_tls_port: int | None = None
    transports: tuple[Transport, ...] = DEFAULT_TRANSPORTS
    timers: SipTimers = field(default_factory=SipTimers)
    limits: SipLimits = field(default_factory=SipLimits)
    # User-Agent of our requests and Server of our responses; empty: the header is left out.
    user_agent: str = "voice-gateway"
    contact_user: str = "gateway"
    # Inbound policy: requests from outside these networks get 403 (empty tuple: everyone is allowed).
    allow_cidrs: tuple[str, ...] = ()
    # When set, initial INVITEs are challenged with 401 (qop=auth) and must carry valid credentials.
    authenticator: Authenticator | None = None
    # Trunks by source address: the source's trunk picks the authenticator of a new call (trunk_auth.py).
    trunks: SourceTrunks | None = None
    # Failed authentications block their source (and username) for a while (lockout.py); None: never.
    lockout: LockoutConfig | None = field(default_factory=LockoutConfig)
    # Out-of-dialog requests whose User-Agent contains one of these (case-insensitive) are dropped unanswered.
    scanner_agents: tuple[str, ...] = ()
    rate_limit: RateLimit | None = field(default_factory=RateLimit)
    session_timer: SessionTimerConfig = field(default_factory=SessionTimerConfig)
    # An outbound proxy (an SBC, the carrier's edge): a SIP URI, e.g. sip:sbc.example:5060;transport=tcp. The
    # calls we place and our REGISTERs go to it, carrying it as a loose-routing Route (RFC 3261 §8.1.2), their
    # Request-URI unchanged; in-dialog requests follow the dialog's route set.
    outbound_proxy: str | None = None
    max_calls: int = 1000

    def __post_init__(self) -> None:
        if not self.transports or any(t not in TRANSPORTS for t in self.transports):
            raise SipConfigError(f"transports must be a non-empty subset of {TRANSPORTS}")
        for port in (self.local_port, self.advertised_port, self.tls_port, self.advertised_tls_port):
            if port is not None and not 0 < port < 65536:
                raise SipConfigError(f"port out of range: {port}")
        try:
            for cidr in self.allow_cidrs:
                ipaddress.ip_network(cidr, strict=False)
        except ValueError as exc:
            raise SipConfigError(f"bad CIDR in allow_cidrs: {exc}") from exc
        if self.max_calls < 1:
            raise SipConfigError("max_calls must be >= 1")
        if self.outbound_proxy is not None:
            check_outbound_proxy(self.outbound_proxy, self.transports)

    @property
    def outbound_proxy_uri(self) -> SipUri | None:
        return parse_uri(self.outbound_proxy) if self.outbound_proxy is not None else None

    @property
    def via_host(self) -> str:
        return self.advertised_host or self.local_host

    @property
    def via_port(self) -> int:
        return self.advertised_port or self.local_port

    def port_for(self, transport: Transport) -> int:
        """The port advertised in Via and Contact for messages over ``transport``."""
        if transport == "tls":
            return self.advertised_tls_port or self.tls_port
        return self.via_port


def check_outbound_proxy(text: str, transports: tuple[str, ...]) -> SipUri:
    """An outbound proxy's URI, checked: a sip: or sips: URI of a host (no user), reached over one of
    ``transports`` when it names one. SipConfigError says what is wrong."""
    try:
        uri = parse_uri(text)
    except RemoteProtocolError as exc:
        raise SipConfigError(f"the outbound proxy {text!r} is not a SIP URI: {exc.reason}") from exc
    if not uri.is_sip or not uri.host or uri.user is not None:
        raise SipConfigError(f"the outbound proxy must be a sip: or sips: URI of a host, got {text!r}")
    if uri.names_transport and uri.transport not in transports:
        raise SipConfigError(
            f"the outbound proxy {text!r} is reached over {uri.transport}, which is not among the transports "
            f"({', '.join(transports)})"
        )
    return uri
