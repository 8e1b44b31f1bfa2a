"""The slices of the media worker's settings, each read from ``GATEWAY_<FIELD>`` and validated on its own.

:class:`gateway.worker.settings.WorkerSettings` composes them and checks the rules between them. Every field's
``description`` is its documentation: ``gateway settings --markdown`` writes the table of docs/operations.md.
"""

from __future__ import annotations

import functools
import ipaddress
import math
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal

from pydantic import AfterValidator, BeforeValidator, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gateway.media.jitter import JitterConfig
from gateway.providers.base import AgentProfile, RealtimeModel
from gateway.providers.pipeline.model import PipelineModel
from gateway.sip.lockout import LockoutConfig

if TYPE_CHECKING:
    from gateway.session.config import SessionConfig

_SIZING = "docs/sizing.md"


def _split_csv(value: object) -> object:
    """A comma-separated environment value as a tuple (``NoDecode`` fields: not JSON)."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


def _checked_cidrs(value: tuple[str, ...]) -> tuple[str, ...]:
    for cidr in value:
        ipaddress.ip_network(cidr, strict=False)
    return value


#: A comma-separated list in the environment; a tuple in code.
Csv = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_split_csv)]
#: A comma-separated list of networks (CIDRs), each checked.
Cidrs = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_split_csv), AfterValidator(_checked_cidrs)]


class _Slice(BaseSettings):
    """One slice of the worker's settings: ``GATEWAY_<FIELD>`` each, frozen."""

    model_config = SettingsConfigDict(env_prefix="GATEWAY_", frozen=True, extra="ignore")
    #: The heading of the slice in the generated settings table.
    title: ClassVar[str] = ""


class WorkerIdSettings(_Slice):
    """The worker's name in the fleet."""

    title: ClassVar[str] = "identity"

    worker_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-w1",
        description="The worker's id in the fleet, unique among the workers of one control plane (letters, "
        "digits, `._:-`); it names the worker in metrics and logs and makes its trunk registration's instance id.",
        json_schema_extra={"doc_default": "<hostname>-w1"},
    )


class SipListenSettings(_Slice):
    """Where the worker listens for SIP, whom it takes requests from, and how it names itself."""

    title: ClassVar[str] = "SIP listener"

    sip_host: str = Field(default="127.0.0.1", description="Bind address of SIP and, unless `GATEWAY_RTP_HOST`, RTP.")
    sip_port: int = Field(default=5060, ge=1, le=65535, description="SIP port, UDP and TCP.")
    sip_transports: Csv = Field(
        default=("udp", "tcp"),
        description="SIP transports listened on, comma-separated: `udp`, `tcp`, `tls` (TLS needs a certificate "
        "or `GATEWAY_SIP_TLS_SELF_SIGNED`).",
    )
    advertised_host: str | None = Field(
        default=None,
        description="Address written into Contact, Via and SDP `c=` lines: the host's public address behind NAT "
        "(unset: `GATEWAY_SIP_HOST`).",
    )
    advertised_sip_port: int | None = Field(
        default=None, ge=1, le=65535, description="SIP port written into Contact and Via behind NAT."
    )
    sip_allow: Cidrs = Field(default=(), description="CIDRs SIP is taken from, comma-separated; empty: any source.")
    sip_auth_realm: str = Field(default="gateway", description="Digest realm of the challenges to callers.")
    sip_auth_user: str | None = Field(
        default=None, description="Callers must authenticate as this user (digest); unset: no challenge."
    )
    sip_auth_password: SecretStr | None = Field(
        default=None, repr=False, description="Password of `GATEWAY_SIP_AUTH_USER`; never logged."
    )
    sip_rate_limit_per_s: float = Field(
        default=500.0,
        gt=0,
        description="SIP requests per second taken from one source address (bursts of twice that); a trunk "
        "places about three requests per call (INVITE, ACK, BYE).",
    )
    session_expires_s: int = Field(
        default=1800, ge=90, description="Session timer (RFC 4028) asked for and granted, in seconds."
    )
    user_agent: str = Field(
        default="voice-gateway/0.1",
        description="User-Agent of our SIP requests and Server of our responses; empty: the header is left out "
        "(the product and version are not given away).",
    )

    @field_validator("sip_transports")
    @classmethod
    def _known_transports(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        lowered = tuple(dict.fromkeys(v.lower() for v in value))
        bad = [v for v in lowered if v not in ("udp", "tcp", "tls")]
        if bad or not lowered:
            raise ValueError(f"sip_transports must be one or more of udp, tcp, tls, got {value!r}")
        return lowered

    @model_validator(mode="after")
    def _auth_pair(self) -> SipListenSettings:
        if (self.sip_auth_user is None) != (self.sip_auth_password is None):
            raise ValueError("set both sip_auth_user and sip_auth_password, or neither")
        return self

    @property
    def public_host(self) -> str:
        return self.advertised_host or self.sip_host

    @property
    def public_sip_port(self) -> int:
        return self.advertised_sip_port or self.sip_port


class SipEdgeSettings(_Slice):
    """Shutting out password guessing and scanners at the SIP edge (gateway/sip/lockout.py)."""

    title: ClassVar[str] = "SIP edge: password guessing and scanners"

    sip_auth_max_failures: int = Field(
        default=5,
        ge=1,
        description="Wrong digest answers from one source address within `GATEWAY_SIP_AUTH_WINDOW_S` that block "
        "it: its out-of-dialog requests are then dropped unanswered (calls in progress go on).",
    )
    sip_auth_window_s: float = Field(default=60.0, gt=0, description="The window failures are counted in.")
    sip_auth_block_s: float = Field(
        default=60.0, gt=0, description="How long the first block of a source (or username) lasts; doubled on repeat."
    )
    sip_auth_max_block_s: float = Field(
        default=3600.0, gt=0, description="The longest block; a source is remembered this long after its last one."
    )
    sip_auth_user_max_failures: int = Field(
        default=20,
        ge=1,
        description="Wrong answers for one username within the window, from any sources, that block the username.",
    )
    sip_never_block: Cidrs = Field(
        default=(),
        description="CIDRs never blocked however many failures they send (a trunk, the office), comma-separated.",
    )
    sip_lockout: bool = Field(default=True, description="Block sources after failed authentications at all.")
    sip_drop_user_agents: Csv = Field(
        default=("friendly-scanner", "sipvicious", "sipcli", "sip-scan", "iwar", "sundayddr", "vaxsipuseragent"),
        description="Out-of-dialog requests whose User-Agent contains one of these (any case) are dropped "
        "unanswered, comma-separated; empty: none.",
    )

    @model_validator(mode="after")
    def _blocks(self) -> SipEdgeSettings:
        if self.sip_auth_max_block_s < self.sip_auth_block_s:
            raise ValueError("sip_auth_max_block_s must be at least sip_auth_block_s")
        return self

    def lockout(self) -> LockoutConfig | None:
        if not self.sip_lockout:
            return None
        return LockoutConfig(
            max_failures=self.sip_auth_max_failures,
            window_s=self.sip_auth_window_s,
            block_s=self.sip_auth_block_s,
            max_block_s=self.sip_auth_max_block_s,
            user_max_failures=self.sip_auth_user_max_failures,
            never_block=self.sip_never_block,
        )


class SipTlsSettings(_Slice):
    """SIP over TLS, with ``tls`` among the transports: its port, our certificate, and whom we verify."""

    title: ClassVar[str] = "SIP over TLS"

    sip_tls_port: int = Field(default=5061, ge=1, le=65535, description="SIP over TLS port.")
    sip_tls_cert: Path | None = Field(default=None, description="Our certificate chain for SIP over TLS (PEM).")
    sip_tls_key: Path | None = Field(default=None, description="The private key of `GATEWAY_SIP_TLS_CERT` (PEM).")
    sip_tls_ca: Path | None = Field(
        default=None, description="CA bundle peers are verified against (PEM); unset: the system trust store."
    )
    sip_tls_verify_server: bool = Field(
        default=True,
        description="Verify the servers we call: their certificate must name the host dialled. Off only for "
        "tests (logged as a warning).",
    )
    sip_tls_client_certs: Literal["none", "optional", "required"] = Field(
        default="none",
        description="Whether callers present a certificate: `required` is mutual TLS against "
        "`GATEWAY_SIP_TLS_CA`, `optional` verifies one when given. Trunks are admitted by address and digest.",
    )
    sip_tls_handshake_timeout_s: float = Field(
        default=10.0, gt=0, le=120, description="A TLS handshake not done by then closes the connection."
    )
    sip_tls_self_signed: bool = Field(
        default=False,
        description="Make and use a self-signed pair in `GATEWAY_STATE_DIR`/sip-tls (its fingerprint is logged): "
        "for tests and trying TLS out, never for a trunk.",
    )
    advertised_sip_tls_port: int | None = Field(
        default=None, ge=1, le=65535, description="SIP over TLS port written into Contact and Via behind NAT."
    )
    state_dir: Path = Field(
        default=Path("~/.local/state/voice-gateway"), description="Where the worker keeps files it makes."
    )

    @field_validator("sip_tls_client_certs", mode="before")
    @classmethod
    def _client_certs(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _cert_pair(self) -> SipTlsSettings:
        if (self.sip_tls_cert is None) != (self.sip_tls_key is None):
            raise ValueError("set both sip_tls_cert and sip_tls_key, or neither")
        return self


class TrunkSettings(_Slice):
    """Calls placed through a trunk, and the worker's registration with it (gateway/worker/registration.py)."""

    title: ClassVar[str] = "Trunk and registration"

    trunk: str | None = Field(
        default=None,
        description="Calls placed to a bare number go to `sip:<number>@<trunk>` (host or host:port, with "
        "`;transport=` if needed).",
    )
    sip_outbound_proxy: str | None = Field(
        default=None,
        description="An outbound proxy (SBC, the carrier's edge): a SIP URI, or host[:port]. Placed calls and "
        "REGISTERs go to it with a loose-routing Route naming it, whatever their Request-URI.",
    )
    trunk_user: str | None = Field(
        default=None, description="Digest username answering the trunk's 401/407 (and the AOR's default user)."
    )
    trunk_password: SecretStr | None = Field(
        default=None, repr=False, description="Digest password of `GATEWAY_TRUNK_USER`; never logged."
    )
    trunk_register: bool = Field(
        default=False,
        description="Register the worker's own contact for the AOR at the trunk's registrar (RFC 3261 §10.2), for "
        "trunks that deliver calls to registered contacts.",
    )
    trunk_registrar: str | None = Field(default=None, description="Registrar URI; unset: `sip:<GATEWAY_TRUNK>`.")
    trunk_aor: str | None = Field(
        default=None,
        description="The AOR registered; unset: `sip:<GATEWAY_TRUNK_USER>@<registrar host>` (its user may differ "
        "from the digest username).",
    )
    trunk_register_expires_s: int = Field(
        default=3600, ge=1, le=2**31 - 1, description="Registration lifetime asked for, in seconds."
    )
    trunk_register_retry_min_s: float = Field(
        default=4.0, gt=0, le=3600, description="First wait after a failed REGISTER; doubled per failure."
    )
    trunk_register_retry_max_s: float = Field(
        default=300.0, gt=0, le=86_400, description="Longest wait between failed REGISTERs."
    )
    trunk_unregister_timeout_s: float = Field(
        default=5.0,
        ge=0,
        le=60,
        description="How long a drain or a shutdown waits for the registrar to confirm the removal of our contact.",
    )
    config: str | None = Field(
        default=None,
        description="The routes file (the control plane's `GATEWAY_CONFIG`): the worker reads its `[trunks.<name>]` "
        'tables at start-up (docs/operations.md, "Trunks"); these `GATEWAY_TRUNK_*` settings are the trunk '
        "named `default`.",
    )
    trunk_unmatched_calls: Literal["allow", "reject"] = Field(
        default="allow",
        description="A new call from no trunk's `sources`: `allow` (challenged only with "
        "`GATEWAY_SIP_AUTH_USER`, as without trunks) or `reject` (403; needs a trunk with `sources`).",
    )

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


class MediaSettings(_Slice):
    """The media of SIP calls: RTP addresses and ports, codecs, SRTP, jitter buffers, the tick's reading."""

    title: ClassVar[str] = "Media"

    rtp_host: str | None = Field(default=None, description="Bind address of RTP; unset: `GATEWAY_SIP_HOST`.")
    rtp_ports: str = Field(
        default="20000-29999", description="RTP/RTCP port range, LO-HI (two ports per call, RTP on the even one)."
    )
    codecs: Csv = Field(
        default=("G722", "PCMU", "PCMA", "opus"),
        description="Codecs taken and offered, in our order, which decides among those a caller offers: G.722 "
        "first gives the speech model wideband audio where the phone has it, at `GATEWAY_G722_CALL_COST`.",
    )
    srtp: Literal["off", "optional", "required"] = Field(
        default="optional",
        description="SDES SRTP on SIP calls. `optional`: SRTP when the offer carries `a=crypto`, our offers RFC "
        "8643 OSRTP (no plain trunk breaks); `required`: SRTP only (a plain offer gets 488); `off`: plain RTP "
        "only (an RTP/SAVP-only offer gets 488).",
    )
    srtp_suites: Csv = Field(
        default=("AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32"),
        description="SRTP suites taken and offered, in our order for our offers (the offerer's order decides in "
        "answers).",
    )
    telephone_event: bool = Field(
        default=True,
        description="Take and offer RFC 4733 telephone-event. False: DTMF goes as SIP INFO or in-band tones and the "
        "caller's tones are detected in its audio (docs/operations.md, DTMF); for a peer whose events misbehave.",
    )
    rtp_timeout_s: float = Field(
        default=30.0, gt=0, description="A call with no RTP for this long (not on hold) is hung up."
    )
    rtp_strict_source: bool = Field(
        default=True,
        description="Symmetric RTP latches only to packets from the IP the SDP named (false: to any source).",
    )
    rtp_read_at_tick: bool = Field(
        default=False,
        description="Read every call's RTP at the start of each tick in one epoll round, with kernel arrival "
        "times (Linux; ADR 0007) instead of a readiness callback per packet (ADR 0002).",
    )
    jitter_min_delay_ms: int = Field(
        default=20, ge=20, le=500, multiple_of=10, description="Least playout delay of a caller's jitter buffer."
    )
    jitter_max_delay_ms: int = Field(
        default=200, ge=20, le=1000, multiple_of=10, description="Most playout delay of a caller's jitter buffer."
    )
    jitter_hold_s: float = Field(
        default=10.0,
        ge=0,
        le=120,
        description="How long a playout delay grown by an underrun is kept before it is given back (0: at once, "
        "in the next pause).",
    )
    opus_encode_ahead_ms: float = Field(
        default=2.0,
        ge=0.0,
        le=1000.0,
        description="Opus callers' frames are encoded a tick ahead (20 ms more delay on the agent's voice) once "
        "more than a tenth of a second's ticks spend longer than this encoding; inline again after 10 s under "
        "half of it (ADR 0013). 0: always ahead; 20 or more: never.",
    )

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
    def _jitter_bounds(self) -> MediaSettings:
        if self.jitter_min_delay_ms > self.jitter_max_delay_ms:
            raise ValueError("jitter_min_delay_ms must not exceed jitter_max_delay_ms")
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

    @property
    def rtp_port_bounds(self) -> tuple[int, int]:
        first, _, last = self.rtp_ports.partition("-")
        return int(first), int(last)


class CapacitySettings(_Slice):
    """What the worker carries and what each call takes of it. Admission counts what the live calls take, not
    how many there are. The figures behind the defaults, and the command that re-measures them: docs/sizing.md."""

    title: ClassVar[str] = "Capacity and call costs"

    capacity: int = Field(
        default=150, ge=1, description=f"What this worker carries, in G.711 calls with the agent active ({_SIZING})."
    )
    opus_call_cost: float = Field(
        default=8.0, ge=1.0, le=1000.0, description=f"Capacity an Opus SIP call takes, in G.711 calls ({_SIZING})."
    )
    g722_call_cost: float = Field(
        default=2.0, ge=1.0, le=1000.0, description=f"Capacity a G.722 SIP call takes, in G.711 calls ({_SIZING})."
    )
    webrtc_call_cost: float = Field(
        default=18.0,
        ge=1.0,
        le=1000.0,
        description=f"Capacity a browser call takes, in G.711 calls ({_SIZING}); `GATEWAY_WEBRTC_MAX_CALLS` still "
        "caps browser calls by count.",
    )
    srtp_call_cost: float = Field(
        default=0.2,
        ge=0.0,
        le=100.0,
        description=f"Capacity a SIP call whose media is SRTP takes on top of its codec's ({_SIZING}).",
    )
    local_stt_call_cost: float = Field(
        default=14.0,
        ge=0.0,
        le=1000.0,
        description=f"Capacity a call takes on top of its media's when its agent transcribes on this worker (a "
        f"`pipeline` profile with the local `whisper` recogniser) ({_SIZING}).",
    )

    def agent_cost(self, model: RealtimeModel, profile: AgentProfile) -> float:
        """What the call's agent takes of ``capacity`` on this worker: a pipeline that runs Whisper here costs
        ``local_stt_call_cost``; agents that run elsewhere (cloud providers, a bot) cost nothing here."""
        if not isinstance(model, PipelineModel):
            return 0.0
        spec = profile.pipeline or model.default_spec
        return self.local_stt_call_cost if spec.stt.name == "whisper" else 0.0

    def call_cost(self, codec: str, *, srtp: bool = False) -> float:
        """How much of ``capacity`` a call with this codec (the names of ``MediaSettings.codecs``) takes, its
        media SRTP or not."""
        name = codec.lower()
        if name == "opus":
            cost = self.opus_call_cost
        else:
            cost = self.g722_call_cost if name == "g722" else 1.0
        return cost + self.srtp_call_cost if srtp else cost

    def offer_cost(self, media: MediaSettings) -> float:
        """What a call takes before its codec is known (our own offer): the dearest codec we offer, with SRTP
        unless it is off (with "optional" the answer may take it)."""
        return max(self.call_cost(codec, srtp=media.srtp != "off") for codec in media.codecs)


class GcSettings(_Slice):
    """The cyclic collector, paced by the media tick (ADR 0010)."""

    title: ClassVar[str] = "Garbage collector"

    gc_paced: bool = Field(
        default=True,
        description="Run the collector's full passes right after a media tick: when no call is live, and at most "
        "once per `GATEWAY_GC_FULL_INTERVAL_S` while calls are. False: whenever CPython's thresholds say.",
    )
    gc_full_interval_s: float = Field(
        default=120.0, ge=1, le=86_400, description="Least time between two full passes while calls are live."
    )
    gc_middle_after: int = Field(
        default=2,
        ge=1,
        le=1000,
        description="Young passes per middle pass while paced (CPython's own: 10): shorter middle passes, more "
        "often, each fitting in the slack of a loaded tick (ADR 0010, second addendum).",
    )


class SessionSettings(_Slice):
    """What each call's session is given: how caller audio goes to the provider, and the tools' grace."""

    title: ClassVar[str] = "Provider audio and tools"

    provider_chunk_ms: int = Field(
        default=20,
        ge=20,
        le=200,
        multiple_of=20,
        description="Caller audio per provider message: 20 ms is the lowest latency; longer trades latency for "
        "worker CPU (docs/performance/2026-12-01-provider-frame-size.md).",
    )
    provider_quiet_chunk_ms: int = Field(
        default=100,
        ge=20,
        le=200,
        multiple_of=20,
        description="Caller audio per provider message once the caller is quiet (listening to the agent); speech "
        "goes out at once. 20 turns this off.",
    )
    provider_quiet_after_ms: int = Field(
        default=1000,
        ge=20,
        le=60_000,
        multiple_of=20,
        description="How long a caller is quiet before `GATEWAY_PROVIDER_QUIET_CHUNK_MS` applies.",
    )
    tool_grace_s: float = Field(
        default=3.0,
        gt=0,
        le=60,
        description="A tool still running after this long is promoted to the background (the agent gets an "
        "interim output).",
    )

    hold_audio_file: str = Field(
        default="",
        max_length=4096,
        description="A WAV file (mono PCM16; 8, 16, 24 or 48 kHz) looped to a caller the gateway puts on hold "
        "(`POST /v1/calls/{id}/hold`); empty: a soft 400 Hz tone, 400 ms every 2 s. Read once, at start-up.",
    )

    @field_validator("hold_audio_file")
    @classmethod
    def _readable_hold_audio(cls, value: str) -> str:
        if value:
            load_hold_audio(value)  # a file that cannot be played is refused at start-up, not at the first hold
        return value

    def session_config(self) -> SessionConfig:
        from gateway.session.config import SessionConfig

        return SessionConfig(
            hold_audio=load_hold_audio(self.hold_audio_file) if self.hold_audio_file else b"",
            tool_grace_s=self.tool_grace_s,
            inbound_chunk_ms=self.provider_chunk_ms,
            inbound_quiet_chunk_ms=self.provider_quiet_chunk_ms,
            inbound_quiet_after_ms=self.provider_quiet_after_ms,
        )


@functools.lru_cache(maxsize=4)
def load_hold_audio(path: str) -> bytes:
    """The hold audio as 24 kHz PCM16 LE (the session's frame format); ValueError naming what is wrong."""
    import wave

    import numpy as np
    from scipy.signal import resample_poly

    try:
        with wave.open(path, "rb") as wav:
            channels, width, rate = wav.getnchannels(), wav.getsampwidth(), wav.getframerate()
            data = wav.readframes(wav.getnframes())
    except (OSError, EOFError, wave.Error) as exc:
        raise ValueError(f"GATEWAY_HOLD_AUDIO_FILE {path!r}: {exc}") from exc
    if channels != 1 or width != 2 or rate not in (8000, 16000, 24000, 48000):
        raise ValueError(
            f"GATEWAY_HOLD_AUDIO_FILE {path!r}: need mono 16-bit PCM at 8, 16, 24 or 48 kHz, "
            f"got {channels} channel(s), {8 * width}-bit, {rate} Hz"
        )
    samples = np.frombuffer(data, dtype="<i2")
    if rate != 24000:
        resampled = resample_poly(
            samples.astype(np.float64), 24000 // math.gcd(24000, rate), rate // math.gcd(24000, rate)
        )
        samples = np.clip(np.round(resampled), -32768, 32767).astype("<i2")
    return samples.tobytes()


class DrainSettings(_Slice):
    """Drains with a deadline (SIGTERM, `gateway drain`, POST .../drain with deadline_s): gateway/worker/drain.py."""

    title: ClassVar[str] = "Drain"

    drain_deadline_s: float = Field(
        default=300.0,
        ge=0,
        le=86_400,
        description="How long a drain lets live calls run before ending them politely: the agent says "
        "`GATEWAY_DRAIN_GOODBYE` and the caller gets a BYE with an RFC 3326 Reason.",
    )
    drain_goodbye: str = Field(
        default="I'm sorry, this line has to close now for maintenance. Please call again in a moment. Goodbye.",
        max_length=500,
        description="What the agent says to calls a drain deadline ends (where the provider speaks).",
    )


class RecordingSettings(_Slice):
    """Where the worker writes call recordings, and how far the writer may fall behind the tick."""

    title: ClassVar[str] = "recordings"

    recordings_dir: Path | None = Field(
        default=None,
        description="Directory of call recordings (`<UTC date>/<call id>.wav|ogg`); the control plane serves them "
        "from the same directory (one host, or a shared volume). Unset: `GATEWAY_STATE_DIR`/recordings.",
    )
    recording_queue_ticks: int = Field(
        default=250,
        ge=10,
        le=60_000,
        description="Ticks of recorded calls' audio queued for the recordings writer; past this a tick is dropped "
        "(written as silence, counted in `gateway_recording_ticks_dropped_total`), never waited for.",
    )


class WarmTransferSettings(_Slice):
    """Warm transfers to a human (gateway/worker/warm.py): where a queue name rings, and how long each step may take."""

    title: ClassVar[str] = "warm transfer"

    warm_transfer_queues: Csv = Field(
        default=(),
        description="Queue names a warm transfer may be given as its target, each `name=target` (a number, "
        "dialled through the trunk of the caller's route, else default, or a SIP URI), comma-separated; empty: "
        "targets are numbers or URIs only.",
    )
    warm_transfer_ring_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=300,
        description="How long the human's phone rings before the caller goes back to the agent, unless the "
        "request gives its own.",
    )
    warm_transfer_brief_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=300,
        description="The longest the briefing of the human may take (their session connecting and speaking the "
        "summary); past it the caller and the human are joined all the same.",
    )
    warm_transfer_briefing: Literal["spoken", "conversation"] = Field(
        default="spoken",
        description="How the human is briefed unless the request says: spoken: the summary is said as one turn "
        "(the human's audio is not heard), then the join; conversation: the human talks with the briefing agent, "
        "which has the summary and two tools, connect_caller (join now) and decline_transfer (the caller goes back "
        "to their agent, told why).",
    )
    warm_transfer_conversation_timeout_s: float = Field(
        default=180.0,
        gt=0,
        le=1800,
        description="The longest a conversational briefing may take before the caller and the human are joined "
        "all the same (POST /v1/calls/{id}/warm_transfer/join joins them earlier).",
    )

    warm_transfer_refer: Literal["off", "auto"] = Field(
        default="off",
        description="Once caller and human are joined, hand the call off with a REFER to the caller carrying a "
        "Replaces of the human's dialog (RFC 3891), so the gateway leaves signalling and media: off: never "
        "(the gateway bridges); auto: when the caller's INVITE listed REFER in Allow and `replaces` in "
        "Supported. A request's `handoff` overrides it; a refused REFER keeps the bridge.",
    )

    @field_validator("warm_transfer_queues")
    @classmethod
    def _queues(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for entry in value:
            name, _, target = entry.partition("=")
            if not name.strip() or not target.strip():
                raise ValueError(f"a warm transfer queue is `name=target`, not {entry!r}")
        return value

    def queues(self) -> dict[str, str]:
        """Queue name -> its target."""
        return {
            name.strip(): target.strip() for name, _, target in (q.partition("=") for q in self.warm_transfer_queues)
        }
