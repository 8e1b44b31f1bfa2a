"""What one load test does: the frozen :class:`LoadConfig`, validated when built, and the target allow-list.

A load generator that can be pointed anywhere is a traffic cannon. Two rules keep it bounded by
construction: the target must be a loopback address unless ``allow_targets`` names a network that contains
it, and every run has a hard deadline (:attr:`LoadConfig.hard_deadline_s`) after which it stops by itself.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from typing import Literal

from gateway.sip.sdes import SUPPORTED_SUITES as SRTP_SUITES

Codec = Literal["PCMU", "PCMA", "opus", "G722"]
AudioKind = Literal["speech", "tone", "silence"]
Transport = Literal["udp", "tcp", "tls"]

CODECS: dict[str, Codec] = {"pcmu": "PCMU", "pcma": "PCMA", "g722": "G722", "opus": "opus"}
#: Slack after the last call's planned end before the run stops regardless (BYE round trips, analysis).
DEADLINE_MARGIN_S = 15.0


class LoadConfigError(ValueError):
    """A load-test setting is invalid."""


class TargetNotAllowedError(LoadConfigError):
    """The target is not loopback and no ``--allow-target`` network contains it."""


def parse_target(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) -> (host, port). The host must be an IP literal."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise LoadConfigError(f"target must look like HOST:PORT, got {text!r}")
    host = host.strip("[]")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise LoadConfigError(f"target host must be an IP address, got {host!r}") from None
    number = int(port)
    if not 0 < number < 65536:
        raise LoadConfigError(f"target port out of range: {number}")
    return host, number


def check_target(host: str, allow: tuple[str, ...]) -> None:
    """Raise :class:`TargetNotAllowedError` unless ``host`` is loopback or inside one of ``allow``."""
    address = ipaddress.ip_address(host)
    if address.is_loopback:
        return
    for cidr in allow:
        try:
            network = ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise LoadConfigError(f"bad --allow-target network {cidr!r}") from None
        if address in network:
            return
    raise TargetNotAllowedError(
        f"refusing to load {host}: not a loopback address; name its network with --allow-target CIDR"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class TalkPattern:
    """How a caller talks: ``talk_ms`` of audio (the marker chirp 200 ms in), then ``pause_ms`` of silence.

    The pause leaves a turn-taking agent room to answer: with a server VAD that waits ``silence_duration_ms``
    (500 ms by default) and echoes the whole turn (with 300 ms of prefix padding), a pause of about
    ``talk_ms + 1800`` lets the reply finish before the caller talks again.
    ``barge_in_ms`` > 0 makes every second pause that short instead, so the next talk spurt starts over the
    agent's reply (a barge-in), ``barge_in_ms`` after the previous spurt ended.
    """

    talk_ms: int = 1200
    pause_ms: int = 3000
    barge_in_ms: int = 0

    def __post_init__(self) -> None:
        for name, least in (("talk_ms", 400), ("pause_ms", 100)):
            value = getattr(self, name)
            if value < least or value % 20:
                raise LoadConfigError(f"{name} must be a multiple of 20 ms and at least {least} ms, got {value}")
        if self.barge_in_ms < 0 or self.barge_in_ms % 20 or self.barge_in_ms >= self.pause_ms:
            raise LoadConfigError("barge_in_ms must be a multiple of 20 ms, >= 0 and shorter than pause_ms")


@dataclass(frozen=True, slots=True, kw_only=True)
class ImpairConfig:
    """What happens to each call's packets on their way to the target (all zero: nothing)."""

    loss_pct: float = 0.0
    jitter_ms: int = 0
    burst_ms: int = 0
    burst_every_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.loss_pct) and 0.0 <= self.loss_pct <= 100.0):
            raise LoadConfigError(f"impair loss must be 0-100 %, got {self.loss_pct}")
        if not 0 <= self.jitter_ms <= 1000:
            raise LoadConfigError(f"impair jitter must be 0-1000 ms, got {self.jitter_ms}")
        if self.burst_ms < 0 or self.burst_ms % 20:
            raise LoadConfigError(f"impair burst must be a multiple of 20 ms, got {self.burst_ms}")
        if self.burst_ms and not (math.isfinite(self.burst_every_s) and self.burst_every_s * 1000 > self.burst_ms):
            raise LoadConfigError("impair burst needs a period (--impair-burst-every) longer than the burst")

    @property
    def active(self) -> bool:
        return bool(self.loss_pct or self.jitter_ms or self.burst_ms)

    def describe(self) -> str:
        parts = []
        if self.loss_pct:
            parts.append(f"loss {self.loss_pct:g} %")
        if self.jitter_ms:
            parts.append(f"jitter 0-{self.jitter_ms} ms")
        if self.burst_ms:
            parts.append(f"{self.burst_ms} ms bursts every {self.burst_every_s:g} s")
        return ", ".join(parts) or "none"


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadConfig:
    """One load test (one process's share of it when spread over workers)."""

    target: tuple[str, int] = ("127.0.0.1", 5060)
    transport: Transport = "udp"
    tls_ca: str | None = None  # tls: verify the target's certificate (chain and name) against this PEM; None: not
    request_user: str = "agent"
    cps: float = 10.0
    calls: int = 10  # concurrency ceiling
    duration_s: float = 10.0  # each call's length from its 200 OK
    total: int | None = None  # calls to place; None: ``calls`` (one wave)
    codec: Codec = "PCMU"
    srtp: str | None = None  # an SDES suite: every call offers RTP/SAVP with it and sends and reads SRTP/SRTCP
    audio: AudioKind = "speech"
    wav: str | None = None  # speech source; None: espeak-ng (cached) or the built-in speech-like signal
    talk: TalkPattern = field(default_factory=TalkPattern)
    dtmf: str = ""  # digits sent (RFC 4733) in the first pause of every call
    local_host: str = "127.0.0.1"
    rtp_ports: tuple[int, int] = (40000, 49999)
    allow_targets: tuple[str, ...] = ()
    setup_timeout_s: float = 10.0
    seed: int = 1
    analyze: bool = True  # markers and correlation per call (the expensive part, done after the load)
    impair: ImpairConfig = field(default_factory=ImpairConfig)  # network impairment of what is sent

    def __post_init__(self) -> None:
        host, port = self.target
        check_target(host, self.allow_targets)
        if self.transport not in ("udp", "tcp", "tls"):
            raise LoadConfigError(f"transport must be udp, tcp or tls, got {self.transport!r}")
        if self.tls_ca is not None and self.transport != "tls":
            raise LoadConfigError("a TLS CA (--tls-ca) is for --transport tls")
        if not (math.isfinite(self.cps) and self.cps > 0):
            raise LoadConfigError(f"cps must be positive, got {self.cps}")
        if self.calls < 1:
            raise LoadConfigError("calls must be >= 1")
        if self.total is not None and self.total < 1:
            raise LoadConfigError("total must be >= 1")
        if not (math.isfinite(self.duration_s) and 0 < self.duration_s <= 24 * 3600):
            raise LoadConfigError(f"duration must be in (0, 86400] s, got {self.duration_s}")
        if self.codec not in ("PCMU", "PCMA", "opus", "G722"):
            raise LoadConfigError(f"codec must be PCMU, PCMA, G722 or opus, got {self.codec!r}")
        if self.srtp is not None and self.srtp not in SRTP_SUITES:
            raise LoadConfigError(f"srtp must be one of {', '.join(SRTP_SUITES)}, got {self.srtp!r}")
        if self.audio not in ("speech", "tone", "silence"):
            raise LoadConfigError(f"audio must be speech, tone or silence, got {self.audio!r}")
        bad = [d for d in self.dtmf if d.upper() not in "0123456789*#ABCD"]
        if bad:
            raise LoadConfigError(f"not DTMF digits: {''.join(bad)!r}")
        first, last = self.rtp_ports
        if not (1024 <= first < last <= 65535) or last - first < 3:
            raise LoadConfigError(f"bad RTP port range {first}-{last}")
        if (last - first) // 2 < self.calls:
            raise LoadConfigError(f"RTP range {first}-{last} holds fewer than {self.calls} port pairs")
        if self.setup_timeout_s <= 0:
            raise LoadConfigError("setup_timeout_s must be positive")
        del port

    @property
    def total_calls(self) -> int:
        return self.total if self.total is not None else self.calls

    @property
    def clock_rate(self) -> int:
        """The RTP clock (G.722's is 8000 although it samples at 16 kHz)."""
        return 48000 if self.codec == "opus" else 8000

    @property
    def audio_rate(self) -> int:
        """The rate of the audio the calls send and are analysed at."""
        return {"opus": 48000, "G722": 16000}.get(self.codec, 8000)

    @property
    def hard_deadline_s(self) -> float:
        """The run stops by itself this long after it started, whatever happens."""
        placing = self.total_calls / self.cps
        # Calls beyond the concurrency ceiling wait for earlier ones to end: one more duration per wave.
        waves = math.ceil(self.total_calls / self.calls)
        return placing + waves * (self.duration_s + self.setup_timeout_s) + DEADLINE_MARGIN_S

    def share(self, index: int, workers: int) -> LoadConfig:
        """This worker's part of the load when spread over ``workers`` processes (disjoint RTP ports)."""
        if workers == 1:
            return self
        first, last = self.rtp_ports
        block = (last - first + 1) // workers
        block -= block % 2
        low = first + index * block
        total = None
        if self.total is not None:
            total = self.total // workers + (1 if index < self.total % workers else 0)
        calls = max(1, self.calls // workers + (1 if index < self.calls % workers else 0))
        from dataclasses import replace

        return replace(
            self,
            cps=self.cps / workers,
            calls=calls,
            total=total,
            rtp_ports=(low, low + block - 1),
            seed=self.seed * 1000 + index,
        )
