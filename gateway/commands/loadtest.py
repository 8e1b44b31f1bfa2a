"""``gateway loadtest``: synthetic SIP/RTP callers against a gateway (or any SIP UAS), and their report.

Places calls at ``--cps`` up to ``--calls`` concurrent, each lasting ``--duration`` s (``--total`` calls in
all), sends speech/tone/silence with a chirp marker at the start of every talk spurt, and reports setup
time, answer status, RTP loss, jitter, sequence errors, pacing error, audio round-trip latency (marker) and
whether the audio came back (correlation). Targets must be loopback unless ``--allow-target`` names their
network; every run stops by itself. Exit status 0; with ``--check``, 1 unless every call was answered, lost
nothing and its audio came back.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="127.0.0.1:5060", help="SIP target HOST:PORT (default 127.0.0.1:5060)")
    parser.add_argument("--transport", choices=["udp", "tcp", "tls"], default="udp", help="SIP transport")
    parser.add_argument(
        "--tls-ca",
        metavar="PEM",
        help="with --transport tls: verify the target's certificate (chain and name) against this CA bundle; "
        "without it the certificate is not checked (a gateway's self-signed test pair)",
    )
    parser.add_argument("--user", default="agent", help="user part of the Request-URI (the dialled number)")
    parser.add_argument("--cps", type=float, default=10.0, help="new calls per second")
    parser.add_argument("--calls", type=int, default=10, help="concurrent calls at most")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds each call lasts after its 200 OK")
    parser.add_argument("--total", type=int, help="calls to place in all (default: --calls)")
    parser.add_argument(
        "--codec", choices=["pcmu", "pcma", "g722", "opus"], default="pcmu", help="the one codec offered"
    )
    parser.add_argument(
        "--srtp",
        nargs="?",
        const="AES_CM_128_HMAC_SHA1_80",
        choices=["AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32"],
        help="offer SDES SRTP (RTP/SAVP) with this suite (default AES_CM_128_HMAC_SHA1_80) and send and read SRTP",
    )
    parser.add_argument("--audio", choices=["speech", "tone", "silence"], default="speech", help="what callers send")
    parser.add_argument("--wav", help="speech WAV (16-bit) instead of espeak-ng / the built-in signal")
    parser.add_argument("--talk-ms", type=int, default=1200, help="talk spurt length (marker at its start)")
    parser.add_argument("--pause-ms", type=int, default=3000, help="silence after each spurt (agent's turn)")
    parser.add_argument(
        "--barge-in", type=int, default=0, metavar="MS", help="every 2nd pause lasts MS instead: talk over the agent"
    )
    parser.add_argument("--dtmf", default="", help="RFC 4733 digits sent in each call's first pause")
    parser.add_argument("--workers", type=int, default=1, help="load-generator processes")
    parser.add_argument(
        "--allow-target", action="append", default=[], metavar="CIDR", help="permit a non-loopback target network"
    )
    parser.add_argument("--local-host", default=None, help="local SIP/RTP address (default: 127.0.0.1 or ::1)")
    parser.add_argument("--rtp-ports", default="40000-49999", help="local RTP port range, split between workers")
    parser.add_argument("--setup-timeout", type=float, default=10.0, help="CANCEL calls not answered by then")
    parser.add_argument("--seed", type=int, default=1, help="random seed (tags, SSRCs, plan variants)")
    parser.add_argument("--no-analysis", action="store_true", help="skip markers and correlation (stats only)")
    parser.add_argument("--json", metavar="FILE", help="write every aggregate as JSON")
    parser.add_argument("--plot", metavar="FILE.png", help="plot concurrency, setup, jitter, latency over time")
    impair = parser.add_argument_group("network impairment of what the callers send (seeded, repeatable)")
    impair.add_argument("--impair-loss", type=float, default=0.0, metavar="PCT", help="drop each packet with PCT %%")
    impair.add_argument("--impair-jitter", type=int, default=0, metavar="MS", help="hold each packet 0..MS ms")
    impair.add_argument(
        "--impair-burst", type=int, default=0, metavar="MS", help="hold a call's packets MS ms, then release them"
    )
    impair.add_argument(
        "--impair-burst-every", type=float, default=5.0, metavar="S", help="one burst per call every S s (5)"
    )
    parser.add_argument("--check", action="store_true", help="exit 1 unless all answered, no loss, audio right")
    parser.add_argument("--no-uvloop", action="store_true", help="use the stdlib asyncio loop")


def build_config(args: argparse.Namespace) -> Any:
    from gateway.loadtest.config import CODECS, ImpairConfig, LoadConfig, LoadConfigError, TalkPattern, parse_target

    target = parse_target(args.target)
    first, sep, last = args.rtp_ports.partition("-")
    if not sep or not first.isdigit() or not last.isdigit():
        raise LoadConfigError(f"--rtp-ports must look like 40000-49999, got {args.rtp_ports!r}")
    local = args.local_host or ("::1" if ":" in target[0] else "127.0.0.1")
    return LoadConfig(
        target=target,
        transport=args.transport,
        tls_ca=args.tls_ca,
        request_user=args.user,
        cps=args.cps,
        calls=args.calls,
        duration_s=args.duration,
        total=args.total,
        codec=CODECS[args.codec],
        srtp=args.srtp,
        audio=args.audio,
        wav=args.wav,
        talk=TalkPattern(talk_ms=args.talk_ms, pause_ms=args.pause_ms, barge_in_ms=args.barge_in),
        dtmf=args.dtmf,
        local_host=local,
        rtp_ports=(int(first), int(last)),
        allow_targets=tuple(args.allow_target),
        setup_timeout_s=args.setup_timeout,
        seed=args.seed,
        analyze=not args.no_analysis,
        impair=ImpairConfig(
            loss_pct=args.impair_loss,
            jitter_ms=args.impair_jitter,
            burst_ms=args.impair_burst,
            burst_every_s=args.impair_burst_every,
        ),
    )


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def passed(summary: dict[str, Any]) -> bool:
    """Every call answered, no packet lost, every checked call's audio came back right."""
    return (
        summary["calls"] > 0
        and summary["answered"] == summary["calls"]
        and summary["packets_lost"] == 0
        and summary["audio_ok"] == summary["audio_checked"]
    )


def main(args: argparse.Namespace) -> int:
    from gateway.loadtest import multi
    from gateway.loadtest.audio import silent_call_reason
    from gateway.loadtest.config import LoadConfigError
    from gateway.loadtest.results import aggregate, progress_line, table

    try:
        config = build_config(args)
    except LoadConfigError as exc:
        print(f"gateway loadtest: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        from gateway.loadtest.plot import missing_reason

        if (missing := missing_reason()) is not None:
            print(f"gateway loadtest: {missing}", file=sys.stderr)
            return 2
    if (reason := silent_call_reason(config.duration_s, config.talk, config.audio)) is not None:
        print(f"gateway loadtest: note: {reason}", file=sys.stderr)
    tty = sys.stderr.isatty()

    def show(parts: list[Any]) -> None:
        if tty:
            sys.stderr.write("\r" + progress_line(parts))
            sys.stderr.flush()

    try:
        result = multi.run(
            config, workers=args.workers, progress=show, use_uvloop=not args.no_uvloop, stop_on_signals=True
        )
    except LoadConfigError as exc:
        print(f"gateway loadtest: {exc}", file=sys.stderr)
        return 2
    except multi.LoadWorkerError as exc:
        print(f"gateway loadtest: a worker failed:\n{exc}", file=sys.stderr)
        return 1
    if tty:
        sys.stderr.write("\n")
    summary = aggregate(result)
    summary["config"] = {
        "target": args.target,
        "transport": args.transport,
        "cps": args.cps,
        "calls": args.calls,
        "duration_s": args.duration,
        "total": config.total_calls,
        "codec": config.codec,
        "audio": args.audio,
        "workers": args.workers,
    }
    print(table(summary))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(_json_safe(summary), fh, indent=2, sort_keys=True)
    if args.plot:
        from gateway.loadtest.plot import plot

        plot(result, args.plot, title=f"gateway loadtest -> {args.target} ({config.codec}, {args.calls} calls)")
    if summary["interrupted"]:
        return 130  # stopped by Ctrl-C or SIGTERM: the report covers what ran
    if args.check and not passed(summary):
        return 1
    return 0
