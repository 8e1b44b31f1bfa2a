"""``gateway bench inband-dtmf``: the CPU the in-band DTMF detector adds to a call's 20 ms frame in the tick.

One :class:`~gateway.media.tick.TickEngine` carries ``--calls`` PCMU calls fed a speech-like signal, one RTP packet
per call per tick, as the worker drives it (``tick_outbound`` then ``tick_inbound``). Each run times the same
ticks twice, alternating: the tick alone (calls that negotiated telephone-event) and the tick plus
:meth:`~gateway.media.inband.InbandDtmf.heard` on every inbound frame (calls that did not). It reports CPU µs per
call-frame for both and their ratio, each the median over ``--repeats`` runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from bench._control import PEER, pcmu_engine, speech_like
from gateway.media.inband import InbandDtmf
from gateway.media.rtp import build_rtp
from telcodecs import g711


def _run(calls: int, ticks: int, *, detect: bool) -> float:
    """CPU µs per call-frame over ``ticks`` ticks of ``calls`` calls."""
    ids = [f"c{i}" for i in range(calls)]
    engine = pcmu_engine(ids)
    inband = {call_id: InbandDtmf(detect=True) for call_id in ids} if detect else {}
    speech = speech_like(ticks * 0.02 + 0.02)
    payloads = [g711.ulaw_encode(speech[i * 160 : (i + 1) * 160]) for i in range(ticks)]
    packets = [
        build_rtp(payload_type=0, sequence_number=i, timestamp=i * 160, ssrc=7, payload=payloads[i], marker=i == 0)
        for i in range(ticks)
    ]
    silence: dict[str, None] = dict.fromkeys(ids)
    began = time.process_time()
    for i in range(ticks):
        now = i * 0.02
        for call_id in ids:
            engine.packet_received(call_id, packets[i], PEER, now)
        engine.tick_outbound(silence, now)
        frames = engine.tick_inbound(now).frames
        if detect:
            for call_id, frame in frames.items():
                if inband[call_id].heard(frame.pcm):
                    raise AssertionError("talk-off in the bench's signal")
    return (time.process_time() - began) / (ticks * calls) * 1e6


def measure(*, calls: int, ticks: int, repeats: int) -> dict[str, Any]:
    without: list[float] = []
    with_: list[float] = []
    ratios: list[float] = []
    _run(calls, 50, detect=True)  # warm-up: imports, numpy's first calls
    for _ in range(repeats):
        plain = _run(calls, ticks, detect=False)
        detected = _run(calls, ticks, detect=True)
        without.append(plain)
        with_.append(detected)
        ratios.append(detected / plain)
    return {
        "calls": calls,
        "ticks": ticks,
        "repeats": repeats,
        "tick_us_per_call_frame": round(statistics.median(without), 2),
        "tick_with_detector_us_per_call_frame": round(statistics.median(with_), 2),
        "detector_us_per_call_frame": round(statistics.median(w - p for w, p in zip(with_, without, strict=True)), 2),
        "ratio": round(statistics.median(ratios), 2),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=50, help="PCMU calls in the tick")
    parser.add_argument("--ticks", type=int, default=250, help="20 ms ticks per timing (250: 5 s of audio)")
    parser.add_argument("--repeats", type=int, default=7, help="timings of each kind; medians are reported")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def main(args: argparse.Namespace) -> int:
    if args.calls < 1 or args.ticks < 10 or args.repeats < 1:
        raise SystemExit("gateway bench inband-dtmf: --calls >= 1, --ticks >= 10, --repeats >= 1")
    result = measure(calls=args.calls, ticks=args.ticks, repeats=args.repeats)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"gateway bench inband-dtmf: {args.calls} PCMU calls, {args.ticks} ticks, medians of {args.repeats}")
    print(f"tick alone              {result['tick_us_per_call_frame']:>8.2f} µs per call-frame")
    print(f"tick + Goertzel detector {result['tick_with_detector_us_per_call_frame']:>7.2f} µs per call-frame")
    print(f"detector                {result['detector_us_per_call_frame']:>8.2f} µs per call-frame")
    print(f"ratio (with / without)  {result['ratio']:>8.2f}")
    return 0
