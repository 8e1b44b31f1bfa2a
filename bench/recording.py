"""What recording a call costs the worker per call-frame, against the same calls unrecorded:
``gateway bench recording`` (``python -m bench.recording``).

``calls`` sessions of the real session core (:class:`gateway.session.session.CallSession`, the echo agent) run in
this process, driven by a 20 ms tick at absolute deadlines as the worker drives them: each tick every call gets
one caller frame (``push_inbound``) and gives one frame back (``pull_outbound``). Recorded runs add exactly what
the worker's tick adds for a recorded call (gateway/worker/worker.py): both frames handed to the call's
:class:`~gateway.worker.recorder.CallRecorder` and the tick's batch to :class:`~gateway.worker.recorder.Recordings`,
whose writer thread mixes (16 kHz stereo, caller left and agent right, by default), encodes and writes the files
into a temporary directory.

The figure is this process's CPU time (user + system, every thread: the writer thread's too) over the measured
ticks, divided by calls x ticks: microseconds per call per 20 ms. Kinds run interleaved (``off``, ``wav``,
``ogg``) so a neighbour's load spreads over all of them; the ratio to ``off`` is taken within each run and the
median of the runs is reported. The media tick's own DSP (jitter buffer, decode, resample, encode, RTP) is the
same with or without a recording and is not part of the ``off`` figure (``gateway bench codecs`` and ``calls``
measure it). The files' sizes give the disk a thousand hours of calls take in each format (docs/sizing.md).
Results and the machine they ran on: docs/performance/2026-12-07-recording.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench._control import NullControl
from gateway.fleet.models import ProfileModel
from gateway.providers.base import AgentProfile
from gateway.providers.echo import EchoModel
from gateway.session.config import SessionConfig
from gateway.session.session import CallSession
from gateway.worker.recorder import Recordings
from telcodecs.frames import FRAME_SAMPLES, Frame

KINDS = ("off", "wav", "ogg")
TICK_S = 0.02
HOUR_TICKS = 3600 * 50


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    kind: str
    calls: int
    ticks: int
    us_per_call_frame: float
    bytes_per_call: float  # of the measured ticks' recording (0 unrecorded)
    dropped_ticks: int


def caller_frames(count: int = 250, seed: int = 7) -> list[np.ndarray]:
    """Five seconds of speech-like noise at 24 kHz: what a codec (Opus above all) cannot squeeze to nothing."""
    rng = np.random.default_rng(seed)
    t = np.arange(count * FRAME_SAMPLES) / 24_000
    envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 3.1 * t) * np.sin(2 * np.pi * 0.7 * t)
    noise = np.convolve(rng.standard_normal(len(t)), np.ones(6) / 6, mode="same")
    pcm = (noise / np.abs(noise).max() * 12_000 * envelope).astype(np.int16)
    frames = [pcm[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES] for i in range(count)]
    for frame in frames:
        frame.flags.writeable = False
    return frames


async def measure(kind: str, *, calls: int, seconds: float, warmup_s: float, rate: int, directory: Path) -> Result:
    config = SessionConfig()
    model = EchoModel()
    sessions = [
        CallSession(
            call_id=f"bench-{i}",
            profile=AgentProfile(name="echo", provider="echo"),
            model=model,
            control=NullControl(),
            config=config,
        )
        for i in range(calls)
    ]
    await asyncio.gather(*(s.start() for s in sessions))
    recordings = Recordings(directory / kind, worker_id="bench", queue_ticks=250)
    recorders = None
    if kind != "off":
        profile = ProfileModel(record="both", record_format=kind, record_sample_rate=rate)  # type: ignore[arg-type]
        opened = [recordings.open(s.call_id, profile) for s in sessions]
        recorders = [r for r in opened if r is not None]
    frames = caller_frames()
    loop = asyncio.get_running_loop()
    warmup_ticks = round(warmup_s / TICK_S)
    ticks = round(seconds / TICK_S)
    cpu_start = 0.0
    deadline = loop.time()
    infos = []
    try:
        for tick in range(warmup_ticks + ticks):
            if tick == warmup_ticks:
                cpu_start = time.process_time()
            pcm = frames[tick % len(frames)]
            if recorders is None:
                for session in sessions:
                    session.pull_outbound(takes_g711=False)
                    session.push_inbound(Frame(index=tick, pcm=pcm))
            else:
                for session, recorder in zip(sessions, recorders, strict=True):
                    recorder.agent = session.pull_outbound(takes_g711=False)
                    recorder.caller = frame = Frame(index=tick, pcm=pcm)
                    session.push_inbound(frame)
                recordings.tick(tick)
            deadline += TICK_S
            await asyncio.sleep(max(0.0, deadline - loop.time()))
        if recorders is not None:
            infos = [await recordings.close(s.call_id) for s in sessions]  # the writer's backlog counts too
        cpu = time.process_time() - cpu_start
    finally:
        await recordings.aclose()
        await asyncio.gather(*(s.aclose("bench done") for s in sessions))
    sizes = [info.bytes for info in infos if info is not None]
    all_ticks = warmup_ticks + ticks
    return Result(
        kind=kind,
        calls=calls,
        ticks=ticks,
        us_per_call_frame=cpu / (calls * ticks) * 1e6,
        bytes_per_call=statistics.mean(sizes) * ticks / all_ticks if sizes else 0.0,
        dropped_ticks=recordings.dropped_ticks,
    )


def run(*, calls: int, seconds: float, warmup_s: float, repeats: int, rate: int) -> dict[str, Any]:
    results: dict[str, list[Result]] = {kind: [] for kind in KINDS}
    ratios: dict[str, list[float]] = {kind: [] for kind in KINDS}
    with tempfile.TemporaryDirectory(prefix="bench-recording-") as tmp:
        for repeat in range(repeats):
            run_results = {}
            for kind in KINDS:
                directory = Path(tmp) / str(repeat)
                run_results[kind] = asyncio.run(
                    measure(kind, calls=calls, seconds=seconds, warmup_s=warmup_s, rate=rate, directory=directory)
                )
                results[kind].append(run_results[kind])
            for kind in KINDS:
                ratios[kind].append(run_results[kind].us_per_call_frame / run_results["off"].us_per_call_frame)
    summary: dict[str, Any] = {"calls": calls, "seconds": seconds, "repeats": repeats, "rate": rate, "kinds": {}}
    for kind, runs in results.items():
        per_hour = statistics.median(r.bytes_per_call / r.ticks * HOUR_TICKS for r in runs)
        summary["kinds"][kind] = {
            "us_per_call_frame": statistics.median(r.us_per_call_frame for r in runs),
            "runs_us": [round(r.us_per_call_frame, 1) for r in runs],
            "ratio_to_off": statistics.median(ratios[kind]),
            "bytes_per_hour": per_hour,
            "gb_per_1000_hours": per_hour * 1000 / 1e9,
            "dropped_ticks": sum(r.dropped_ticks for r in runs),
        }
    return summary


def table(summary: dict[str, Any]) -> str:
    lines = [
        f"{summary['calls']} calls, {summary['seconds']:g} s measured, median of {summary['repeats']}, "
        f"stereo {summary['rate']} Hz",
        f"{'recording':<10} {'µs/call-frame':>14} {'x off':>7} {'MB/hour':>9} {'GB/1000 h':>10} {'dropped':>8}",
    ]
    for kind, figures in summary["kinds"].items():
        lines.append(
            f"{kind:<10} {figures['us_per_call_frame']:>14.1f} {figures['ratio_to_off']:>7.2f} "
            f"{figures['bytes_per_hour'] / 1e6:>9.1f} {figures['gb_per_1000_hours']:>10.1f} "
            f"{figures['dropped_ticks']:>8}"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=50, help="concurrent calls")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of every kind (median reported)")
    parser.add_argument("--rate", type=int, default=16_000, choices=(8000, 16_000, 24_000, 48_000))
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def main(args: argparse.Namespace) -> int:
    summary = run(calls=args.calls, seconds=args.seconds, warmup_s=args.warmup, repeats=args.repeats, rate=args.rate)
    print(json.dumps(summary, indent=2) if args.json else table(summary))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
