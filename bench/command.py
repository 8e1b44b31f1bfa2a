"""``gateway bench``: sizing benchmarks. ``codecs`` measures the DSP path; ``calls`` the whole worker; ``frames``
the per-message work of the provider path (websocket framing, base64); ``webrtc`` what a browser call costs;
``stalls`` how long rendering ``/metrics`` and building a heartbeat hold a worker's event loop; ``fec`` how many
lost Opus packets in-band FEC mends, by the caller's jitter-buffer depth; ``records`` what the record an RTP parse
returns costs in the compiled build; ``sip-transports`` what SIP over TLS costs against UDP and TCP;
``cluster`` two workers behind Kamailio against one worker taken directly; ``heartbeat`` the Redis-backed control
plane's CPU per live call, its store requests batched against one per call.

``gateway`` finds this module through the ``gateway.commands`` entry point that bench/pyproject.toml declares:
``HELP``, ``add_arguments`` and ``main`` are what it uses. Keep the imports here light (argparse only): every
``gateway`` invocation loads this module to build its parser."""

from __future__ import annotations

import argparse
import sys

HELP = "measure codec and call throughput (see docs/performance.md)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="WHAT", required=True)
    codecs = sub.add_parser("codecs", help="µs per call per 20 ms frame: G.711/Opus <-> 24 kHz, batched vs per-call")
    codecs.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    codecs.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (median is reported)")
    codecs.add_argument("--quick", action="store_true", help="fewer frames per measurement (for tests)")
    frames = sub.add_parser(
        "frames", help="µs per provider message: framing and base64, the gateway's way vs the obvious one"
    )
    frames.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    frames.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (median is reported)")
    frames.add_argument("--count", type=int, default=20000, help="messages per timing")
    stalls = sub.add_parser(
        "stalls", help="how long /metrics and a heartbeat hold the event loop: in one stretch vs in slices"
    )
    stalls.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    stalls.add_argument("--renders", type=int, default=200, help="times each piece of work runs each way")
    stalls.add_argument("--calls", type=int, default=400, help="calls in the heartbeat")
    fec = sub.add_parser(
        "fec", help="lost Opus packets mended by in-band FEC at a shallow jitter buffer: delay kept vs grown"
    )
    fec.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    fec.add_argument("--seeds", type=int, default=5, help="loss patterns (medians are reported)")
    fec.add_argument("--loss-pct", type=float, default=3.0, help="packets lost at random, percent")
    fec.add_argument("--seconds", type=float, default=40.0, help="speech per stream")
    records = sub.add_parser(
        "records", help="ns per RTP packet parsed in the compiled build: NamedTuple, frozen dataclass or slots class"
    )
    records.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    records.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (median is reported)")
    records.add_argument("--count", type=int, default=200_000, help="packets per timing")
    transports = sub.add_parser(
        "sip-transports", help="µs per OPTIONS round trip over UDP, TCP and TLS; a TLS handshake and record"
    )
    transports.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    transports.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (median is reported)")
    transports.add_argument("--count", type=int, default=400, help="round trips per transport per repetition")
    calls = sub.add_parser(
        "calls",
        help="concurrent bridged calls one worker core sustains, AI leg active (see docs/performance.md)",
    )
    calls.add_argument("--steps", help="comma-separated concurrency steps (default 50,100,200,300,400,600,800)")
    calls.add_argument("--quick", action="store_true", help="smoke run: steps 20,50, a 5 s window")
    calls.add_argument("--codec", choices=["pcmu", "pcma", "g722", "opus"], default="pcmu", help="codec of every call")
    calls.add_argument(
        "--engine", choices=["batched", "percall"], default="batched", help="the worker's media design under test"
    )
    calls.add_argument(
        "--provider", choices=["openai", "echo"], default="openai", help="openai = the fake server over websocket"
    )
    calls.add_argument("--chunk-ms", type=int, default=20, help="caller audio per provider message (20..100)")
    calls.add_argument(
        "--quiet-chunk-ms",
        type=int,
        default=100,
        help="caller audio per provider message once the caller has been quiet for 1 s (= --chunk-ms: off)",
    )
    calls.add_argument(
        "--provider-format",
        choices=["pcm24k", "pcmu"],
        default="pcm24k",
        help="audio format toward the provider; pcmu = G.711 passthrough (the callers' codes as they came)",
    )
    calls.add_argument("--window", type=float, default=20.0, help="measurement window per step, seconds")
    calls.add_argument("--ramp-cps", type=float, default=50.0, help="call rate while a step ramps up")
    calls.add_argument("--repeats", type=int, default=1, help="runs per step (medians are reported)")
    calls.add_argument("--worker-core", type=int, default=0, help="CPU the worker is pinned to (-1: none)")
    calls.add_argument(
        "--load-core",
        type=_cpu_list,
        default=(1,),
        help="CPU or CPUs for the generator and the fake: 1, 1,2,3 or 2-5 (-1: none)",
    )
    calls.add_argument(
        "--fakes", type=int, default=1, help="fake provider processes sharing one port (a larger host's load side)"
    )
    calls.add_argument(
        "--load-workers", type=int, default=1, help="load generator processes (1: in the bench process itself)"
    )
    calls.add_argument(
        "--profile",
        metavar="FILE",
        help="FILE.prof: the worker under cProfile; FILE.perf: perf over each window into FILE.perf-CALLS.data "
        "(sees into a --compiled worker); any other name: py-spy into FILE-CALLS.txt. "
        "Read them with python -m bench._profile",
    )
    calls.add_argument(
        "--gc-census",
        action="store_true",
        help="count what the worker's middle collector passes walk, by kind, and print it per step "
        "(each census stalls the worker ~20 ms at 400 calls: judge overruns in runs without it)",
    )
    calls.add_argument(
        "--scrape-every",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="GET the worker's /metrics this often through each window, as a Prometheus server would "
        "(default: only the two scrapes that bound the window)",
    )
    calls.add_argument(
        "--metrics-render",
        choices=["exposition", "generate_latest"],
        default="exposition",
        help="how the worker renders /metrics: in slices, as gateway worker does (default), or in one stretch "
        "with prometheus-client's generate_latest (the comparison)",
    )
    calls.add_argument("--json", metavar="FILE", help="write every row as JSON")
    calls.add_argument("--no-uvloop", action="store_true", help="stdlib asyncio loop in worker, generator and fake")
    calls.add_argument(
        "--compiled", metavar="DIR", help="run the worker on the `gateway compile` build in DIR (GATEWAY_COMPILED)"
    )
    calls.add_argument(
        "--against-source",
        action="store_true",
        help="with --compiled: also run the source worker, interleaved, and report the CPU ratio",
    )
    calls.add_argument(
        "--srtp",
        nargs="?",
        const="AES_CM_128_HMAC_SHA1_80",
        choices=["AES_CM_128_HMAC_SHA1_80", "AES_CM_128_HMAC_SHA1_32"],
        help="also run every step with the calls over SDES SRTP (this suite; default _80), interleaved with plain "
        "RTP, and report the ratio of their CPU per call-frame",
    )
    calls.add_argument("--nice", type=int, default=0, help="niceness of the bench processes (negative: root only)")
    calls.add_argument(
        "--rtp-base",
        type=int,
        default=40000,
        help="first UDP port of the load generator's RTP range (default 40000; move it off another bench's)",
    )
    heartbeat = sub.add_parser(
        "heartbeat",
        help="the control plane's CPU per live call per heartbeat, state in Redis: batched store requests vs per call",
    )
    heartbeat.add_argument(
        "--calls", type=_sizes, default=(50, 100, 200, 400), help="comma-separated sizes (default 50,100,200,400)"
    )
    heartbeat.add_argument("--heartbeats", type=int, default=20, help="timed heartbeats per run (default 20)")
    heartbeat.add_argument("--repeats", type=int, default=3, help="runs of each path per size (medians reported)")
    heartbeat.add_argument("--json", metavar="FILE", help="write every run as JSON")
    cluster = sub.add_parser(
        "cluster",
        help="calls per core and setup latency: two workers behind Kamailio against one worker taken directly",
    )
    cluster.add_argument(
        "--calls", type=_sizes, default=(50, 100, 200), help="comma-separated sizes, calls in all (default 50,100,200)"
    )
    cluster.add_argument("--cps", type=float, default=20.0, help="call rate of every phase (default 20)")
    cluster.add_argument("--window", type=float, default=10.0, help="measurement window per phase, seconds")
    cluster.add_argument("--repeats", type=int, default=3, help="runs of each placement per size (medians reported)")
    cluster.add_argument(
        "--codec", choices=["pcmu", "pcma", "g722", "opus"], default="pcmu", help="codec of every call"
    )
    cluster.add_argument(
        "--worker-cores",
        type=_cpu_list,
        default=(0,),
        help="CPUs of the two workers: 0 (both on CPU 0), 2,3 (one each) ... (-1: not pinned)",
    )
    cluster.add_argument(
        "--load-cores",
        type=_cpu_list,
        default=(1,),
        help="CPUs of Kamailio, the control plane, the fake provider and the generator (-1: not pinned)",
    )
    cluster.add_argument("--redis", action="store_true", help="a Redis-backed control plane (starts redis-server)")
    cluster.add_argument(
        "--kamailio-config", metavar="FILE", help="Kamailio configuration (default: deploy/kamailio/dispatcher.cfg)"
    )
    cluster.add_argument("--kamailio-children", type=int, default=2, help="Kamailio's SIP worker processes")
    cluster.add_argument(
        "--compiled", metavar="DIR", help="run the workers on the `gateway compile` build in DIR (GATEWAY_COMPILED)"
    )
    cluster.add_argument("--json", metavar="FILE", help="write every run and the medians as JSON")
    cluster.add_argument("--no-uvloop", action="store_true", help="stdlib asyncio loop in workers, generator, fake")
    webrtc = sub.add_parser(
        "webrtc", help="worker CPU per browser call (aiortc) against a G.711 SIP call, on one `gateway run`"
    )
    webrtc.add_argument("--calls", type=int, default=8, help="concurrent browser calls")
    webrtc.add_argument("--g711-calls", type=int, default=100, help="concurrent PCMU calls to compare with (0: none)")
    webrtc.add_argument("--window", type=float, default=10.0, help="measurement window, seconds")
    webrtc.add_argument("--repeats", type=int, default=3, help="runs (medians are reported)")
    webrtc.add_argument(
        "--encoder",
        choices=["both", "gateway", "aiortc"],
        default="gateway",
        help="who encodes the agent's Opus: the gateway's track, aiortc's sender, or both interleaved",
    )
    webrtc.add_argument(
        "--decoder",
        choices=["both", "gateway", "aiortc"],
        default="both",
        help="who decodes the caller's Opus: the gateway on its loop, aiortc's decoder thread, or both interleaved",
    )
    webrtc.add_argument("--worker-core", type=int, default=0, help="CPU `gateway run` is pinned to (-1: none)")
    webrtc.add_argument(
        "--load-core",
        type=_cpu_list,
        default=(1,),
        help="CPU or CPUs for the browsers and the loadtest: 1, 1,2,3 or 2-5 (-1: none)",
    )
    webrtc.add_argument("--json", metavar="FILE", help="write every run as JSON")


def main(args: argparse.Namespace) -> int:
    if args.bench == "codecs":
        from bench.codecs import run

        return run(json_output=args.json, repeats=args.repeats, quick=args.quick)
    if args.bench == "frames":
        from bench.frames import run as run_frames

        if args.repeats < 1 or args.count < 1:
            raise SystemExit("gateway bench frames: --repeats and --count must be at least 1")
        return run_frames(json_output=args.json, repeats=args.repeats, count=args.count)
    if args.bench == "stalls":
        from bench.stalls import run as run_stalls

        if args.renders < 1 or args.calls < 1:
            raise SystemExit("gateway bench stalls: --renders and --calls must be at least 1")
        return run_stalls(renders=args.renders, calls=args.calls, json_output=args.json)
    if args.bench == "records":
        from bench.records import run as run_records

        if args.repeats < 1 or args.count < 1000:
            raise SystemExit("gateway bench records: --repeats >= 1 and --count >= 1000")
        return run_records(repeats=args.repeats, count=args.count, json_output=args.json)
    if args.bench == "sip-transports":
        from bench.sip_transports import run as run_transports

        if args.repeats < 1 or args.count < 10:
            raise SystemExit("gateway bench sip-transports: --repeats >= 1 and --count >= 10")
        return run_transports(repeats=args.repeats, count=args.count, json_output=args.json)
    if args.bench == "fec":
        from bench.fec import run as run_fec

        if args.seeds < 1 or not 0 < args.loss_pct < 50 or args.seconds < 2:
            raise SystemExit("gateway bench fec: --seeds >= 1, 0 < --loss-pct < 50 and --seconds >= 2")
        return run_fec(seeds=args.seeds, loss_pct=args.loss_pct, seconds=args.seconds, json_output=args.json)
    if args.bench == "calls":
        from bench.calls import DEFAULT_STEPS, QUICK_STEPS, CallsBenchConfig
        from bench.calls import run as run_calls
        from gateway.loadtest.config import CODECS

        steps = QUICK_STEPS if args.quick else DEFAULT_STEPS
        if args.steps:
            steps = tuple(int(part) for part in args.steps.split(",") if part.strip())
        config = CallsBenchConfig(
            steps=steps,
            codec=CODECS[args.codec],
            engine=args.engine,
            provider=args.provider,
            chunk_ms=args.chunk_ms,
            quiet_chunk_ms=max(args.quiet_chunk_ms, args.chunk_ms),
            provider_format=args.provider_format,
            window_s=5.0 if args.quick else args.window,
            ramp_cps=args.ramp_cps,
            repeats=args.repeats,
            worker_core=None if args.worker_core < 0 else args.worker_core,
            load_core=args.load_core or None,
            fakes=args.fakes,
            load_workers=args.load_workers,
            profile=args.profile,
            uvloop=not args.no_uvloop,
            nice=args.nice,
            rtp_base=args.rtp_base,
            compiled=args.compiled,
            against_source=args.against_source,
            srtp=args.srtp,
            gc_census=args.gc_census,
            scrape_every_s=args.scrape_every,
            metrics_render=args.metrics_render,
        )
        if args.fakes < 1 or args.load_workers < 1:
            raise SystemExit("gateway bench calls: --fakes and --load-workers must be at least 1")
        if args.scrape_every < 0:
            raise SystemExit("gateway bench calls: --scrape-every must be 0 (off) or a number of seconds")
        if args.fakes > 1 and args.provider != "openai":
            raise SystemExit("gateway bench calls: --fakes runs fake OpenAI servers; it needs --provider openai")
        if args.load_workers > min(steps):
            raise SystemExit(f"gateway bench calls: {args.load_workers} load workers for a step of {min(steps)} calls")
        if args.against_source and not args.compiled:
            raise SystemExit("gateway bench calls: --against-source needs --compiled DIR")
        if args.against_source and args.srtp:
            raise SystemExit("gateway bench calls: --srtp compares against plain RTP; leave out --against-source")
        if args.engine == "percall" and args.compiled:
            # Its engine subclasses TickEngine, and an interpreted class cannot subclass a compiled one.
            raise SystemExit("gateway bench calls: --engine percall runs from source only; leave out --compiled")
        return run_calls(config, json_path=args.json)
    if args.bench == "heartbeat":
        from bench.heartbeat import run as run_heartbeat

        if args.heartbeats < 1 or args.repeats < 1 or min(args.calls) < 1:
            raise SystemExit("gateway bench heartbeat: --calls, --heartbeats and --repeats must be at least 1")
        return run_heartbeat(sizes=args.calls, heartbeats=args.heartbeats, repeats=args.repeats, json_path=args.json)
    if args.bench == "cluster":
        from pathlib import Path

        from bench.cluster import ClusterBenchConfig
        from bench.cluster import run as run_cluster
        from bench.kamailio import DEFAULT_CONFIG
        from gateway.loadtest.config import CODECS as CLUSTER_CODECS

        try:
            cluster_config = ClusterBenchConfig(
                sizes=args.calls,
                cps=args.cps,
                window_s=args.window,
                repeats=args.repeats,
                codec=CLUSTER_CODECS[args.codec],
                worker_cores=args.worker_cores or None,
                load_cores=args.load_cores or None,
                redis=args.redis,
                kamailio_config=Path(args.kamailio_config) if args.kamailio_config else DEFAULT_CONFIG,
                kamailio_children=args.kamailio_children,
                compiled=args.compiled,
                uvloop=not args.no_uvloop,
            )
        except ValueError as exc:
            print(f"gateway bench cluster: {exc}", file=sys.stderr)
            return 2
        return run_cluster(cluster_config, json_path=args.json)
    if args.bench == "webrtc":
        from bench.webrtc import WebRtcBenchConfig
        from bench.webrtc import run as run_webrtc

        try:
            webrtc_config = WebRtcBenchConfig(
                calls=args.calls,
                g711_calls=args.g711_calls,
                window_s=args.window,
                repeats=args.repeats,
                encoders=("gateway", "aiortc") if args.encoder == "both" else (args.encoder,),
                decoders=("gateway", "aiortc") if args.decoder == "both" else (args.decoder,),
                worker_core=None if args.worker_core < 0 else args.worker_core,
                load_core=args.load_core or None,
            )
        except ValueError as exc:
            raise SystemExit(f"gateway bench webrtc: {exc}") from None
        return run_webrtc(webrtc_config, json_path=args.json)
    raise SystemExit(f"unknown benchmark {args.bench!r}")


def _cpu_list(text: str) -> tuple[int, ...]:
    from bench.processes import cpu_list

    try:
        return cpu_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of call counts: {text!r} (say 50,100,200)") from None
    if not sizes:
        raise argparse.ArgumentTypeError("no size given")
    return sizes
