"""``gateway bench tracing``: what a call's trace costs per call-frame, with tracing off and on.

The same calls (``--calls`` echo-agent sessions, ``--frames`` 20 ms frames each way, started and closed within the
timing) run through the session core three ways, interleaved ``--repeats`` times:

- ``none``: sessions made without a trace (no instrumentation call at all: the build without it);
- ``off``: each call with a :class:`gateway.tracing.CallTrace` on the API's no-op tracer (no SDK provider
  installed: how a gateway runs without ``OTEL_EXPORTER_OTLP_ENDPOINT``);
- ``on``: the SDK's tracer provider exporting to its in-memory exporter (spans recorded and exported).

The figure is process CPU time per call-frame (one frame in and one out); the ratios to ``none`` say what the
trace costs. Spans are made from call events only, so the per-frame path carries no tracing call either way. The
echo agent has no turns, so the cost of one event's span (a turn's, made whole as the session makes it) is timed
apart: µs per span, off and on.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import numpy as np
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer

from bench._control import NullControl
from gateway.providers.base import AgentProfile
from gateway.providers.echo import EchoModel
from gateway.session.config import SessionConfig
from gateway.session.session import CallSession
from gateway.tracing import CallTrace, gateway_tracer
from telcodecs.frames import FRAME_SAMPLES, Frame

KINDS = ("none", "off", "on")


def _frames(count: int) -> list[Frame]:
    rng = np.random.default_rng(7)
    return [
        Frame(index=i, pcm=rng.integers(-3000, 3000, FRAME_SAMPLES, dtype=np.int64).astype(np.int16))
        for i in range(count)
    ]


async def _run(kind: str, *, calls: int, frames: list[Frame], tracer: Tracer | None) -> float:
    """CPU seconds for ``calls`` calls of ``len(frames)`` frames each way, setup and teardown included."""
    model, config, profile = EchoModel(), SessionConfig(), AgentProfile(name="bench")
    began = time.process_time()
    traces = [CallTrace(f"b-{i}", "call", tracer=tracer) if kind != "none" else None for i in range(calls)]
    sessions = [
        CallSession(call_id=f"b-{i}", profile=profile, model=model, control=NullControl(), config=config, trace=trace)
        for i, trace in enumerate(traces)
    ]
    await asyncio.gather(*(s.start() for s in sessions))
    for frame in frames:
        for session in sessions:
            session.push_inbound(frame)
            session.pull_outbound()
        await asyncio.sleep(0)
    await asyncio.gather(*(s.aclose() for s in sessions))
    for trace in traces:
        if trace is not None:
            trace.close(end_reason="bench")
    return time.process_time() - began


def _span_us(tracer: Tracer, count: int) -> float:
    """CPU µs per turn span (one per turn of a call), as :meth:`CallTrace.span` makes it."""
    call = CallTrace("b-span", "call", tracer=tracer)
    began = time.process_time()
    for index in range(count):
        end = time.time()
        call.span("call.turn", {"gateway.turn.index": index, "gateway.turn.latency_ms": 612.5}, start_time_s=end - 0.6)
    spent = time.process_time() - began
    call.close()
    return spent * 1e6 / count


def measure(*, calls: int, frames: int, repeats: int) -> dict[str, Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracers: dict[str, Tracer | None] = {"none": None, "off": gateway_tracer(), "on": provider.get_tracer("bench")}
    pcm = _frames(frames)
    runs: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for _ in range(repeats):
        for kind in KINDS:
            exporter.clear()
            seconds = asyncio.run(_run(kind, calls=calls, frames=pcm, tracer=tracers[kind]))
            runs[kind].append(seconds * 1e6 / (calls * frames))
    spans = len(exporter.get_finished_spans())
    span_runs: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(repeats):
        for kind in span_runs:
            tracer = tracers[kind]
            assert tracer is not None
            exporter.clear()
            span_runs[kind].append(_span_us(tracer, 5000))
    medians = {kind: statistics.median(values) for kind, values in runs.items()}
    return {
        "calls": calls,
        "frames": frames,
        "repeats": repeats,
        "us_per_call_frame": medians,
        "runs_us": runs,
        "ratio_off": medians["off"] / medians["none"],
        "ratio_on": medians["on"] / medians["none"],
        "spans_per_call_on": spans / calls,
        "us_per_turn_span": {kind: statistics.median(values) for kind, values in span_runs.items()},
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--calls", type=int, default=20, help="calls per run")
    parser.add_argument("--frames", type=int, default=500, help="20 ms frames each way per call")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (median is reported)")


def main(args: argparse.Namespace) -> int:
    if min(args.calls, args.frames, args.repeats) < 1:
        raise SystemExit("gateway bench tracing: --calls, --frames and --repeats must be at least 1")
    result = measure(calls=args.calls, frames=args.frames, repeats=args.repeats)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    medians = result["us_per_call_frame"]
    print(f"µs of CPU per call-frame, median of {args.repeats} interleaved runs ({args.calls} calls x {args.frames})")
    print(f"{'trace':<8} {'µs':>8} {'vs none':>8}")
    for kind in KINDS:
        print(f"{kind:<8} {medians[kind]:>8.2f} {medians[kind] / medians['none']:>7.3f}x")
    print(f"spans per call with tracing on: {result['spans_per_call_on']:.1f}")
    span = result["us_per_turn_span"]
    print(f"µs of CPU per turn span: off {span['off']:.2f}, on (in-memory export) {span['on']:.2f}")
    return 0
