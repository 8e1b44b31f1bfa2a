"""``gateway bench WHAT``: the sizing benchmarks, one module each, named in :data:`BENCHES`.

``gateway`` finds this module through the ``gateway.commands`` entry point that bench/pyproject.toml declares
(docs/adr/0025) and uses ``HELP``, ``add_arguments`` and ``main``. Every ``gateway`` invocation builds its parser,
so this module stays light: a benchmark's module (numpy, psutil, the gateway's parts) is imported only when that
benchmark is named on the command line, by :class:`_LazyBenches`, which then lets the module add its arguments.

A benchmark module has ``add_arguments(parser)`` and ``main(args) -> int``; adding one is one line in
:data:`BENCHES` (bench/README.md).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence
from typing import Any

HELP = "measure codec and call throughput (see docs/performance.md)"

# name -> (module, one-line help). The module's docstring says what it measures and how.
BENCHES: dict[str, tuple[str, str]] = {
    "codecs": ("bench.codecs", "µs per call per 20 ms frame: G.711/Opus <-> 24 kHz, batched vs per-call"),
    "frames": ("bench.frames", "µs per provider message: framing and base64, the gateway's way vs the obvious one"),
    "stalls": ("bench.stalls", "how long /metrics and a heartbeat hold the event loop: in one stretch vs in slices"),
    "fec": ("bench.fec", "lost Opus packets mended by in-band FEC at a shallow jitter buffer: delay kept vs grown"),
    "records": (
        "bench.records",
        "ns per RTP packet parsed in the compiled build: NamedTuple, frozen dataclass or slots class",
    ),
    "sip-transports": (
        "bench.sip_transports",
        "µs per OPTIONS round trip over UDP, TCP and TLS; a TLS handshake and record",
    ),
    "calls": (
        "bench.calls",
        "concurrent bridged calls one worker core sustains, AI leg active (see docs/performance.md)",
    ),
    "heartbeat": (
        "bench.heartbeat",
        "the control plane's CPU per live call per heartbeat, state in Redis: batched store requests vs per call",
    ),
    "call-records": (
        "bench.call_records",
        "the control plane's CPU per call for keeping its record in the database of calls (SQLite or PostgreSQL)",
    ),
    "cluster": (
        "bench.cluster",
        "calls per core and setup latency: two workers behind Kamailio against one worker taken directly",
    ),
    "call-hook": (
        "bench.call_hook",
        "setup latency a route's call-time application adds to admission (p50/p99), against a local application",
    ),
    "webrtc": ("bench.webrtc", "worker CPU per browser call (aiortc) against a G.711 SIP call, on one `gateway run`"),
    "recording": (
        "bench.recording",
        "CPU per call-frame of recording a call (WAV, Ogg/Opus) against the same calls unrecorded; disk per hour",
    ),
    "websocket-bot": (
        "bench.websocket_bot",
        "CPU per call-frame of a call answered by a websocket bot, against an echo call",
    ),
    "guardrails": (
        "bench.guardrails",
        "CPU per call-frame of output guardrails over the agent's transcript, against the same calls without",
    ),
    "pipeline": (
        "bench.pipeline",
        "the cascaded pipeline through the session core with loopback fakes: latency, CPU, barge-in",
    ),
    "tracing": (
        "bench.tracing",
        "CPU per call-frame of a traced call: no instrumentation, tracing off (no-op API), on (in-memory export)",
    ),
    "inband-dtmf": (
        "bench.inband_dtmf",
        "CPU per call-frame of in-band DTMF detection in the tick, against the same calls without it",
    ),
    "warm-bridge": (
        "bench.warm_bridge",
        "CPU per leg-frame of a warm-transferred call bridged in the tick, against the same legs with an agent",
    ),
    "amd": (
        "bench.amd",
        "answering-machine detection on the labelled set: precision, recall, beep timing, CPU per frame",
    ),
    "local-pipeline": (
        "bench.local_pipeline",
        "the local pipeline's turn latency and CPU per call (Whisper, Silero, espeak-ng): no keys, no network",
    ),
}


class _LazyBenches(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Subcommands whose arguments come from their module, imported when the subcommand is parsed."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        assert isinstance(values, list) and values  # a subparsers action always gets the name and the rest
        name = values[0]
        if name in BENCHES and not hasattr(namespace, "_bench_module"):
            module = importlib.import_module(BENCHES[name][0])
            module.add_arguments(self._name_parser_map[name])
            namespace._bench_module = module
        super().__call__(parser, namespace, values, option_string)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench", metavar="WHAT", required=True, action=_LazyBenches)
    for name, (_module, help_text) in BENCHES.items():
        sub.add_parser(name, help=help_text, description=help_text)


def main(args: argparse.Namespace) -> int:
    return int(args._bench_module.main(args) or 0)
