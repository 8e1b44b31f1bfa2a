"""What a warm-transferred call costs the worker per call-frame once bridged, against the same legs with an agent:
``gateway bench warm-bridge`` (``python -m bench.warm_bridge``).

``--legs`` PCMU legs in one :class:`~gateway.media.tick.TickEngine`, each fed one RTP packet of speech-like audio
per 20 ms tick, driven as the worker's tick drives them (gateway/worker/worker.py): outbound frames, then
``tick_outbound``, then ``tick_inbound``, and each inbound frame handed on. Two kinds run interleaved:

- ``agent``: every leg has a :class:`~gateway.session.session.CallSession` (the echo agent): its frame is pulled
  from the session and its caller frame pushed into it, the sessions' own tasks running on the loop;
- ``bridged``: the legs are joined in pairs by :class:`~gateway.worker.bridge.Bridge`, each leg's frame handed to
  the other's encoder (a G.711 leg's codes pass as they are), no session.

The figure is this process's CPU time over the measured ticks divided by legs x ticks, microseconds per leg and
20 ms; a bridged call is two legs, an agent call one. The ticks are paced at absolute 20 ms deadlines, since the
sessions' tasks run in real time. The ratio is taken within each repeat and its median reported. The provider's
websocket (the echo agent is in-process) is not counted: the agent figure is the gateway's own share.
Results: docs/performance/2026-12-07-warm-transfer-bridge.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from bench._control import PEER, NullControl, pcmu_engine, speech_like
from gateway.media.rtp import build_rtp
from gateway.media.tick import OutboundFrame
from gateway.providers.base import AgentProfile
from gateway.providers.echo import EchoModel
from gateway.session.config import SessionConfig
from gateway.session.session import CallSession
from gateway.worker.bridge import Bridge
from telcodecs import g711

TICK_S = 0.02
KINDS = ("agent", "bridged")


def _packets(ticks: int) -> list[bytes]:
    speech = speech_like(ticks * TICK_S + TICK_S)
    return [
        build_rtp(
            payload_type=0,
            sequence_number=i % 65536,
            timestamp=i * 160,
            ssrc=7,
            payload=g711.ulaw_encode(speech[i * 160 : (i + 1) * 160]),
            marker=i == 0,
        )
        for i in range(ticks)
    ]


async def measure(kind: str, *, legs: int, ticks: int, warmup: int, packets: list[bytes]) -> float:
    """CPU µs per leg-frame of ``kind`` over ``ticks`` ticks (after ``warmup``)."""
    ids = [f"c{i}" for i in range(legs)]
    engine = pcmu_engine(ids)
    sessions: dict[str, CallSession] = {}
    bridges: dict[str, Bridge] = {}
    if kind == "agent":
        model = EchoModel()
        sessions = {
            call_id: CallSession(
                call_id=call_id,
                profile=AgentProfile(name="echo", provider="echo"),
                model=model,
                control=NullControl(),
                config=SessionConfig(),
            )
            for call_id in ids
        }
        await asyncio.gather(*(s.start() for s in sessions.values()))
    else:
        for a, b in zip(ids[::2], ids[1::2], strict=True):
            bridge = Bridge(a, b)
            bridge.joined = True
            bridges[a] = bridges[b] = bridge
    loop = asyncio.get_running_loop()
    deadline = loop.time()
    cpu_start = 0.0
    try:
        for tick in range(warmup + ticks):
            if tick == warmup:
                cpu_start = time.process_time()
            now = tick * TICK_S
            packet = packets[tick % len(packets)]
            for call_id in ids:
                engine.packet_received(call_id, packet, PEER, now)
            outbound: dict[str, OutboundFrame] = {}
            for call_id, takes_g711 in engine.takes_g711:
                if sessions:
                    outbound[call_id] = sessions[call_id].pull_outbound(takes_g711=takes_g711)
                else:
                    outbound[call_id] = bridges[call_id].frame_for(call_id)
            engine.tick_outbound(outbound, now)
            for call_id, frame in engine.tick_inbound(now).frames.items():
                if sessions:
                    sessions[call_id].push_inbound(frame)
                else:
                    bridges[call_id].heard(call_id, frame)
            deadline += TICK_S
            await asyncio.sleep(max(0.0, deadline - loop.time()))
        cpu = time.process_time() - cpu_start
    finally:
        await asyncio.gather(*(s.aclose("bench done") for s in sessions.values()))
    if bridges:
        handed = sum(b.frames for b in set(bridges.values()))
        assert handed >= (warmup + ticks - 2) * legs, "the bridge handed on fewer frames than were heard"
    return cpu / (legs * ticks) * 1e6


def run(*, legs: int, seconds: float, warmup_s: float, repeats: int) -> dict[str, Any]:
    ticks, warmup = round(seconds / TICK_S), round(warmup_s / TICK_S)
    packets = _packets(250)
    figures: dict[str, list[float]] = {kind: [] for kind in KINDS}
    ratios: list[float] = []
    for _ in range(repeats):
        run_figures = {
            kind: asyncio.run(measure(kind, legs=legs, ticks=ticks, warmup=warmup, packets=packets)) for kind in KINDS
        }
        for kind, figure in run_figures.items():
            figures[kind].append(figure)
        ratios.append(run_figures["bridged"] / run_figures["agent"])
    agent, bridged = statistics.median(figures["agent"]), statistics.median(figures["bridged"])
    return {
        "legs": legs,
        "seconds": seconds,
        "repeats": repeats,
        "agent_us_per_leg_frame": round(agent, 1),
        "bridged_us_per_leg_frame": round(bridged, 1),
        "agent_runs": [round(f, 1) for f in figures["agent"]],
        "bridged_runs": [round(f, 1) for f in figures["bridged"]],
        "bridged_over_agent": round(statistics.median(ratios), 2),
        # A bridged call is two legs; the call it replaced had one leg and an agent.
        "bridged_call_over_agent_call": round(2 * statistics.median(ratios), 2),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--legs", type=int, default=50, help="PCMU legs in the tick (even: bridged in pairs)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds per kind and repeat")
    parser.add_argument("--warmup", type=float, default=1.0, help="seconds before measuring")
    parser.add_argument("--repeats", type=int, default=5, help="repeats; medians are reported")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def main(args: argparse.Namespace) -> int:
    if args.legs < 2 or args.legs % 2 or args.seconds <= 0 or args.repeats < 1:
        raise SystemExit("gateway bench warm-bridge: --legs even and >= 2, --seconds > 0, --repeats >= 1")
    result = run(legs=args.legs, seconds=args.seconds, warmup_s=args.warmup, repeats=args.repeats)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"gateway bench warm-bridge: {args.legs} PCMU legs, {args.seconds:g} s x {args.repeats}, medians")
    print(f"agent leg (tick + echo session)  {result['agent_us_per_leg_frame']:>8.1f} µs per leg-frame")
    print(f"bridged leg (tick + bridge)      {result['bridged_us_per_leg_frame']:>8.1f} µs per leg-frame")
    print(f"bridged / agent, per leg         {result['bridged_over_agent']:>8.2f}")
    print(f"bridged call (2 legs) / agent call {result['bridged_call_over_agent_call']:>6.2f}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
