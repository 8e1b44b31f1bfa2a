"""Media worker settings, read once at start-up from the environment (``GATEWAY_*``) and CLI flags."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gateway.media.jitter import JitterConfig


class WorkerSettings(BaseSettings):
    """One media worker: where it listens for SIP and RTP, what it offers, and how hard it works."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", frozen=True, extra="ignore")

    worker_id: str = Field(default_factory=lambda: f"{socket.gethostname()}-w1")
    sip_host: str = "127.0.0.1"
    sip_port: int = Field(default=5060, ge=1, le=65535)
    sip_transports: Annotated[tuple[str, ...], NoDecode] = ("udp", "tcp")
    # SIP over TLS (with "tls" in sip_transports): its own port, our certificate chain and key (PEM), the CA bundle
    # peers are verified against (unset: the system trust store), whether servers we call are verified (their
    # certificate must name the host dialled) and whether callers must present a certificate (mutual TLS). Defaults
    # fit a trunk: trunks present public certificates and are admitted by address and digest, not client certificates.
    sip_tls_port: int = Field(default=5061, ge=1, le=65535)
    sip_tls_cert: Path | None = None
    sip_tls_key: Path | None = None
    sip_tls_ca: Path | None = None
    sip_tls_verify_server: bool = True
    sip_tls_client_certs: Literal["none", "optional", "required"] = "none"
    sip_tls_handshake_timeout_s: float = Field(default=10.0, gt=0, le=120)
    # Tests and local runs: a self-signed pair kept in state_dir/sip-tls (made if missing; its fingerprint is logged).
    sip_tls_self_signed: bool = False
    state_dir: Path = Path("~/.local/state/voice-gateway")
    # Address written into Contact, Via and SDP c= lines (the host's public address behind NAT).
    advertised_host: str | None = None
    advertised_sip_port: int | None = Field(default=None, ge=1, le=65535)
    advertised_sip_tls_port: int | None = Field(default=None, ge=1, le=65535)
    rtp_host: str | None = None  # defaults to sip_host
    rtp_ports: str = "20000-29999"
    # Our order decides which of the offered codecs a call takes. G.722 first: a phone that offers wideband gets it
    # (7 kHz of the caller's voice to the speech model instead of 3.4), at g722_call_cost of a G.711 call.
    codecs: Annotated[tuple[str, ...], NoDecode] = ("G722", "PCMU", "PCMA", "opus")
    # SDES SRTP on SIP calls (gateway/sip/sdes.py). "optional": SRTP when the offer carries a=crypto, plain RTP
    # otherwise, and our own offers are RFC 8643 OSRTP (RTP/AVP with a=crypto, which a plain peer ignores), so
    # turning SRTP on breaks no plain trunk; "required": SRTP only (a plain offer gets 488, our offers are
    # RTP/SAVP); "off": plain RTP only (an RTP/SAVP-only offer gets 488).
    srtp: Literal["off", "optional", "required"] = "optional"
    # The suites taken and offered, in our order for our offers (the offerer's order decides in answers).
    srtp_suites: Annotated[tuple[str, ...], NoDecode] = ("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32")
    # What one worker core carries with the AI leg active, in G.711 calls: 150 (docs/performance.md). A call
    # takes 1 of it with PCMU/PCMA, g722_call_cost with G.722 (libg722 both ways on every frame, silence included:
    # 1.5-1.6x a G.711 call's CPU in `gateway bench calls --codec g722` from source, 1.8x compiled: the same
    # ~35 µs per frame over a cheaper G.711 call), opus_call_cost with Opus over SIP (3.6x the CPU at the knee
    # in `gateway bench calls --codec opus`, whose agent is mostly silent, about 6x for one that talks
    # throughout; 8 leaves room) and
    # webrtc_call_cost from a browser (aiortc: Opus, SRTP and a decoder thread per call, about 18x: `gateway
    # bench webrtc`); a SIP call whose media is SRTP takes srtp_call_cost more, whatever its codec (libsrtp's
    # protect and unprotect, ~2 µs a packet each way: 1.1-1.3x a G.711 call's CPU in `gateway bench calls
    # --srtp`). Admission counts what the live calls take, not how many.
    capacity: int = Field(default=150, ge=1)
    opus_call_cost: float = Field(default=8.0, ge=1.0, le=1000.0)
    g722_call_cost: float = Field(default=2.0, ge=1.0, le=1000.0)
    webrtc_call_cost: float = Field(default=18.0, ge=1.0, le=1000.0)
    srtp_call_cost: float = Field(default=0.2, ge=0.0, le=100.0)
    rtp_timeout_s: float = Field(default=30.0, gt=0)
    # Opus callers' frames are encoded a tick ahead (their packets leave at the start of the tick, 20 ms more
    # delay on the agent's voice) once more than a tenth of the ticks in a second spend more than this encoding;
    # back inline after 10 s under half of it (docs/adr/0013). 0: always ahead; 20 or more: never.
    opus_encode_ahead_ms: float = Field(default=2.0, ge=0.0, le=1000.0)
    # Symmetric RTP: latch only to packets from the IP the SDP named (False: latch to any source).
    rtp_strict_source: bool = True
    # True: RTP read by the media tick, all calls in one epoll round, with kernel arrival times (Linux; ADR 0007,
    # which measured no CPU gain and a longer tick). False: a readiness callback per packet (ADR 0002).
    rtp_read_at_tick: bool = False
    # Callers' jitter buffers (gateway/media/jitter.py): the playout delay stays within [min, max] ms and,
    # after an underrun grew it, is kept jitter_hold_s before it is given back (0: at once, in the next pause).
    jitter_min_delay_ms: int = Field(default=20, ge=20, le=500, multiple_of=10)
    jitter_max_delay_ms: int = Field(default=200, ge=20, le=1000, multiple_of=10)
    jitter_hold_s: float = Field(default=10.0, ge=0, le=120)
    sip_allow: Annotated[tuple[str, ...], NoDecode] = ()  # CIDRs; empty = any source
    sip_auth_realm: str = "gateway"
    sip_auth_user: str | None = None
    sip_auth_password: str | None = None
    # Per source address: a trunk placing 100 calls/s sends ~300 requests/s (INVITE, ACK, BYE).
    sip_rate_limit_per_s: float = Field(default=500.0, gt=0)
    # Outbound calls to a bare number go to sip:<number>@<trunk> (host or host:port); a 401/407 from the
    # trunk is answered with digest credentials when trunk_user/trunk_password are set.
    trunk: str | None = None
    # An outbound proxy (SBC, the carrier's edge; a SIP URI, or host[:port] for sip:host[:port]): the calls a
    # worker places and its REGISTERs go to it with a loose-routing Route naming it, whatever their Request-URI.
    sip_outbound_proxy: str | None = None
    trunk_user: str | None = None
    trunk_password: SecretStr | None = Field(default=None, repr=False)
    # Outbound registration (gateway/worker/registration.py): each worker binds its own contact to the AOR at the
    # registrar (default sip:<trunk>), authenticating as trunk_user. The AOR defaults to sip:<trunk_user>@<host of
    # the registrar>; its user may differ from the digest username.
    trunk_register: bool = False
    trunk_registrar: str | None = None
    trunk_aor: str | None = None
    trunk_register_expires_s: int = Field(default=3600, ge=1, le=2**31 - 1)
    trunk_register_retry_min_s: float = Field(default=4.0, gt=0, le=3600)
    trunk_register_retry_max_s: float = Field(default=300.0, gt=0, le=86_400)
    # How long a drain or a shutdown waits for the registrar to confirm the removal of our contact.
    trunk_unregister_timeout_s: float = Field(default=5.0, ge=0, le=60)
    session_expires_s: int = Field(default=1800, ge=90)
    user_agent: str = "voice-gateway/0.1"
    # A tool still running after this long is promoted to the background (the agent gets an interim output).
    # Caller audio per provider message: 20 ms is lowest latency; 40-100 ms trade latency for worker CPU
    # (docs/performance.md, "Frame size toward the provider").
    provider_chunk_ms: int = Field(default=20, ge=20, le=200, multiple_of=20)
    # A caller quiet for provider_quiet_after_ms (listening to the agent) is sent in provider_quiet_chunk_ms
    # messages (never smaller than provider_chunk_ms); speech goes out at once. 20 turns this off.
    provider_quiet_chunk_ms: int = Field(default=100, ge=20, le=200, multiple_of=20)
    provider_quiet_after_ms: int = Field(default=1000, ge=20, le=60_000, multiple_of=20)
    tool_grace_s: float = Field(default=3.0, gt=0, le=60)
    # Full collector passes (every live object, 30-95 ms in a busy worker) run right after a media tick: when no
    # call is live, and at most once per gc_full_interval_s while calls are (ADR 0010). False: whenever CPython's
    # thresholds say.
    gc_paced: bool = True
    gc_full_interval_s: float = Field(default=120.0, ge=1, le=86_400)
    # Young collector passes per middle (generation-1) pass while gc_paced (CPython's own: 10). Each middle pass
    # walks what outlived the young passes since the last: at 2 they are shorter and come more often, so one
    # fits in the slack of a loaded tick (ADR 0010, second addendum).
    gc_middle_after: int = Field(default=2, ge=1, le=1000)
    # A drain with a deadline (SIGTERM, `gateway drain`, POST .../drain with deadline_s) lets live calls run this
    # long, then ends those still up politely: the agent says drain_goodbye (where the provider speaks; bounded
    # by the session's goodbye timeout) and the caller gets a BYE with an RFC 3326 Reason.
    drain_deadline_s: float = Field(default=300.0, ge=0, le=86_400)
    drain_goodbye: str = Field(
        default="I'm sorry, this line has to close now for maintenance. Please call again in a moment. Goodbye.",
        max_length=500,
    )

    @field_validator("sip_transports", "codecs", "sip_allow", "srtp_suites", mode="before")
    @classmethod
    def _split_csv(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("sip_transports")
    @classmethod
    def _known_transports(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        lowered = tuple(dict.fromkeys(v.lower() for v in value))
        bad = [v for v in lowered if v not in ("udp", "tcp", "tls")]
        if bad or not lowered:
            raise ValueError(f"sip_transports must be one or more of udp, tcp, tls, got {value!r}")
        return lowered

    @field_validator("sip_tls_client_certs", mode="before")
    @classmethod
    def _client_certs(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("codecs")
    @classmethod
    def _known_codecs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        names = {"pcmu": "PCMU", "pcma": "PCMA", "opus": "opus", "g722": "G722"}
        out = []
        for v in value:
            if v.lower() not in names:
                raise ValueError(f"unknown codec {v!r}; choose from G722, PCMU, PCMA, opus")
            out.append(names[v.lower()])
        if not out:
            raise ValueError("at least one codec is needed")
        return tuple(out)

    @field_validator("srtp", mode="before")
    @classmethod
    def _srtp_mode(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("srtp_suites")
    @classmethod
    def _known_suites(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from gateway.sip.sdes import SUPPORTED_SUITES

        out = tuple(v.upper() for v in value)
        bad = [v for v in out if v not in SUPPORTED_SUITES]
        if bad or not out or len(set(out)) != len(out):
            raise ValueError(f"srtp_suites must be one or more of {', '.join(SUPPORTED_SUITES)}, got {value!r}")
        return out

    @field_validator("sip_allow")
    @classmethod
    def _cidrs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for cidr in value:
            ipaddress.ip_network(cidr, strict=False)
        return value

    @field_validator("sip_outbound_proxy", mode="before")
    @classmethod
    def _proxy_uri(cls, value: object) -> object:
        if isinstance(value, str):
            value = value.strip()
            if not value:
                return None
            if not value.lower().startswith(("sip:", "sips:")):
                return f"sip:{value}"
        return value

    @field_validator("rtp_ports")
    @classmethod
    def _port_range(cls, value: str) -> str:
        first, sep, last = value.partition("-")
        if not sep or not first.strip().isdigit() or not last.strip().isdigit():
            raise ValueError(f"rtp_ports must look like 20000-29999, got {value!r}")
        lo, hi = int(first), int(last)
        if not (1024 <= lo < hi <= 65535) or hi - lo < 3:
            raise ValueError(f"rtp_ports range {value!r} is not within 1024-65535 or too small")
        return value

    @model_validator(mode="after")
    def _auth_pair(self) -> WorkerSettings:
        if (self.sip_auth_user is None) != (self.sip_auth_password is None):
            raise ValueError("set both sip_auth_user and sip_auth_password, or neither")
        if self.jitter_min_delay_ms > self.jitter_max_delay_ms:
            raise ValueError("jitter_min_delay_ms must not exceed jitter_max_delay_ms")
        if (self.sip_tls_cert is None) != (self.sip_tls_key is None):
            raise ValueError("set both sip_tls_cert and sip_tls_key, or neither")
        if "tls" in self.sip_transports:
            if self.sip_tls_cert is None and not self.sip_tls_self_signed:
                raise ValueError(
                    "the tls transport needs sip_tls_cert and sip_tls_key (or sip_tls_self_signed=true for a test pair)"
                )
            if self.sip_tls_cert is not None and self.sip_tls_self_signed:
                raise ValueError("sip_tls_self_signed is for running without a certificate: unset one of them")
            if "tcp" in self.sip_transports and self.sip_tls_port == self.sip_port:
                raise ValueError(f"sip_tls_port {self.sip_tls_port} is taken by SIP over TCP (sip_port)")
        if self.sip_outbound_proxy is not None:
            from gateway.sip.config import check_outbound_proxy
            from gateway.sip.errors import SipConfigError

            try:
                check_outbound_proxy(self.sip_outbound_proxy, self.sip_transports)
            except SipConfigError as exc:
                raise ValueError(f"sip_outbound_proxy: {exc}") from exc
        if self.trunk_register:
            from gateway.worker.registration import check_registration_settings

            check_registration_settings(self)
        return self

    @property
    def jitter_config(self) -> JitterConfig:
        """The playout policy of every SIP caller's jitter buffer on this worker."""
        low, high, default = self.jitter_min_delay_ms, self.jitter_max_delay_ms, JitterConfig()
        return JitterConfig(
            min_delay_ms=low,
            max_delay_ms=high,
            start_delay_ms=min(max(default.start_delay_ms, low), high),
            horizon_ms=max(default.horizon_ms, 2 * high),
            shrink_hold_frames=round(self.jitter_hold_s * 50),
        )

    def call_cost(self, codec: str, *, srtp: bool = False) -> float:
        """How much of ``capacity`` a call with this codec (the names of ``codecs``) takes, its media SRTP or
        not."""
        name = codec.lower()
        if name == "opus":
            cost = self.opus_call_cost
        else:
            cost = self.g722_call_cost if name == "g722" else 1.0
        return cost + self.srtp_call_cost if srtp else cost

    def offer_cost(self) -> float:
        """What a call takes before its codec is known (our own offer): the dearest codec we offer, with SRTP
        unless it is off (with "optional" the answer may take it)."""
        return max(self.call_cost(codec, srtp=self.srtp != "off") for codec in self.codecs)

    @property
    def rtp_port_bounds(self) -> tuple[int, int]:
        first, _, last = self.rtp_ports.partition("-")
        return int(first), int(last)

    @property
    def media_host(self) -> str:
        return self.rtp_host or self.sip_host

    @property
    def public_host(self) -> str:
        return self.advertised_host or self.sip_host

    @property
    def public_sip_port(self) -> int:
        return self.advertised_sip_port or self.sip_port

    @property
    def public_sip_tls_port(self) -> int:
        return self.advertised_sip_tls_port or self.sip_tls_port
