"""Command-line flags shared by ``gateway run`` and ``gateway worker`` (they override GATEWAY_* settings)."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import Any

from gateway.providers.base import RealtimeModel
from gateway.session.amd_listen import GreetingTranscribing
from gateway.session.config import SessionConfig
from gateway.worker.settings import WorkerSettings


def add_worker_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sip-host", help="SIP/RTP bind address (default: GATEWAY_SIP_HOST or 127.0.0.1)")
    parser.add_argument("--sip-port", type=int, help="SIP port, UDP and TCP (default: GATEWAY_SIP_PORT or 5060)")
    parser.add_argument(
        "--sip-transports", help="SIP transports, e.g. udp,tcp,tls (default: GATEWAY_SIP_TRANSPORTS or udp,tcp)"
    )
    parser.add_argument("--sip-tls-port", type=int, help="SIP over TLS port (default: GATEWAY_SIP_TLS_PORT or 5061)")
    parser.add_argument("--sip-tls-cert", help="PEM certificate chain for SIP over TLS (GATEWAY_SIP_TLS_CERT)")
    parser.add_argument("--sip-tls-key", help="PEM private key of --sip-tls-cert (GATEWAY_SIP_TLS_KEY)")
    parser.add_argument(
        "--sip-tls-ca", help="PEM CA bundle peers are verified against (default: the system trust store)"
    )
    parser.add_argument(
        "--sip-tls-self-signed",
        action="store_true",
        default=None,
        help="make and use a self-signed TLS pair in GATEWAY_STATE_DIR (tests and local runs, never for trunks)",
    )
    parser.add_argument("--advertised-host", help="address written in Contact/Via/SDP (behind NAT)")
    parser.add_argument("--rtp-ports", help="RTP port range, e.g. 20000-29999")
    parser.add_argument("--codecs", help="codec preference, e.g. PCMU,PCMA,opus")
    parser.add_argument(
        "--srtp",
        choices=["off", "optional", "required"],
        help="SDES SRTP on SIP calls (default: GATEWAY_SRTP or optional: SRTP when offered, our offers OSRTP)",
    )
    parser.add_argument(
        "--srtp-suites", help="SRTP suites taken and offered, e.g. AES_CM_128_HMAC_SHA1_80,AES_CM_128_HMAC_SHA1_32"
    )
    parser.add_argument("--capacity", type=int, help="what this worker carries, in G.711 calls")
    parser.add_argument(
        "--opus-call-cost", type=float, help="how many G.711 calls' worth of capacity an Opus SIP call takes"
    )
    parser.add_argument(
        "--webrtc-call-cost", type=float, help="how many G.711 calls' worth of capacity a browser call takes"
    )
    parser.add_argument(
        "--g722-call-cost", type=float, help="how many G.711 calls' worth of capacity a G.722 SIP call takes"
    )
    parser.add_argument(
        "--srtp-call-cost", type=float, help="how much more of the capacity a SIP call takes when its media is SRTP"
    )
    parser.add_argument("--worker-id", help="worker id (default: <hostname>-w1)")
    parser.add_argument(
        "--drain-deadline",
        type=float,
        help="seconds a drain (SIGTERM included) lets live calls run before ending them politely (default 300)",
    )
    parser.add_argument("--provider", help="default provider: echo, openai, gemini (default: GATEWAY_PROVIDER)")
    parser.add_argument("--no-uvloop", action="store_true", help="use the stdlib asyncio loop")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])


def setup_logging(level: str, *, service: str = "gateway-worker") -> None:
    """Logging, and tracing when an OTLP endpoint is set (then log lines carry the call's trace ids)."""
    from gateway.tracing import configure_tracing, log_format

    traced = configure_tracing(service)
    logging.basicConfig(level=level.upper(), format=log_format(traced))


#: The flags that set a worker setting: (argparse dest, setting name, as GATEWAY_<NAME>).
FLAG_SETTINGS: tuple[tuple[str, str], ...] = (
    ("sip_host", "sip_host"),
    ("sip_port", "sip_port"),
    ("sip_transports", "sip_transports"),
    ("sip_tls_port", "sip_tls_port"),
    ("sip_tls_cert", "sip_tls_cert"),
    ("sip_tls_key", "sip_tls_key"),
    ("sip_tls_ca", "sip_tls_ca"),
    ("sip_tls_self_signed", "sip_tls_self_signed"),
    ("advertised_host", "advertised_host"),
    ("rtp_ports", "rtp_ports"),
    ("codecs", "codecs"),
    ("srtp", "srtp"),
    ("srtp_suites", "srtp_suites"),
    ("capacity", "capacity"),
    ("opus_call_cost", "opus_call_cost"),
    ("webrtc_call_cost", "webrtc_call_cost"),
    ("g722_call_cost", "g722_call_cost"),
    ("srtp_call_cost", "srtp_call_cost"),
    ("worker_id", "worker_id"),
    ("drain_deadline", "drain_deadline_s"),
    ("config", "config"),  # `gateway run --config` and `gateway worker --config`: the [trunks] tables
)


def worker_settings(args: argparse.Namespace) -> WorkerSettings:
    """The worker's settings: the environment, with the flags given on top (each to its slice)."""
    overrides: dict[str, Any] = {}
    for flag, key in FLAG_SETTINGS:
        value = getattr(args, flag, None)
        if value is not None:
            overrides[key] = value
    return WorkerSettings(**overrides)


def stop_timeout_s(settings: WorkerSettings, session: SessionConfig, reason: str) -> float:
    """How long a stop may take: a SIGTERM drain runs to its deadline, then the goodbyes and the calls' close."""
    if reason != "SIGTERM":
        return 15.0
    return settings.drain.drain_deadline_s + session.goodbye_timeout_s + session.close_timeout_s + 30.0


def amd_recognisers() -> GreetingTranscribing:
    """What builds the recogniser a profile names in ``amd_stt``, with the pipeline's keys and URLs."""
    from gateway.providers.registry import greeting_recognisers

    return greeting_recognisers()


def preload_local_models() -> None:
    """Whisper loading in a thread now when GATEWAY_PIPELINE_WHISPER_PRELOAD says so (nothing without the local
    extra's components installed: the setting is then an error the first call reports too)."""
    from gateway.providers.pipeline.local.factories import preload_whisper

    preload_whisper()


def model_factory(default_provider: str | None = None) -> Callable[[str], RealtimeModel]:
    """Providers by name, configured from the environment; checked once up front for the default."""
    from gateway.providers.registry import ProviderSettings, create_model

    settings = ProviderSettings()
    if default_provider:
        settings = settings.model_copy(update={"provider": default_provider})
    create_model(None, settings)  # fail at start-up, not on the first call, when a key is missing

    def factory(name: str) -> RealtimeModel:
        if name in ("", "default"):
            name = settings.provider
        return create_model(name, settings)

    return factory
