"""Micro-benchmark of the media tick (not a test): cost per 20 ms tick for N G.711 calls.

Run: .venv/bin/python tests/gateway/media/bench_tick.py [N ...]
Each tick: every call receives one 20 ms PCMU packet (packet_received), then tick_inbound and tick_outbound
with a 24 kHz frame per call. Prints the median and p99 cost of each phase, in milliseconds per tick.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

from gateway.media.call import MediaCallConfig
from gateway.media.rtp import build_rtp
from gateway.media.tick import TickEngine
from telcodecs.frames import Frame
from telcodecs.g711 import ulaw_encode

PEER = ("192.0.2.10", 4000)


def run(calls: int, ticks: int = 500, codec: str = "PCMU") -> dict[str, list[float]]:
    engine = TickEngine()
    ids = [f"call-{i}" for i in range(calls)]
    pt = {"PCMU": 0, "PCMA": 8, "opus": 111}[codec]
    for i, cid in enumerate(ids):
        engine.add_call(
            MediaCallConfig(
                call_id=cid,
                codec=codec,  # type: ignore[arg-type]
                payload_type=pt,
                telephone_event_pt=101,
                remote_rtp=PEER,
                ssrc=i + 1,
                initial_sequence=i,
                initial_timestamp=i * 1000,
            ),
            now=0.0,
        )
    rng = np.random.default_rng(1)
    payload = ulaw_encode((rng.standard_normal(160) * 2000).astype(np.int16))
    frame = Frame(index=0, pcm=(rng.standard_normal(480) * 2000).astype(np.int16))
    outbound = dict.fromkeys(ids, frame)
    cost: dict[str, list[float]] = {"receive": [], "inbound": [], "outbound": []}
    for k in range(ticks):
        now = k * 0.02
        packets = [build_rtp(payload_type=pt, sequence_number=k, timestamp=k * 160, ssrc=7, payload=payload)] * calls
        t0 = time.perf_counter()
        for cid, data in zip(ids, packets):
            engine.packet_received(cid, data, PEER, now)
        t1 = time.perf_counter()
        engine.tick_inbound(now + 0.001)
        t2 = time.perf_counter()
        engine.tick_outbound(outbound, now + 0.001)
        t3 = time.perf_counter()
        if k >= 20:  # skip the warm-up
            cost["receive"].append((t1 - t0) * 1e3)
            cost["inbound"].append((t2 - t1) * 1e3)
            cost["outbound"].append((t3 - t2) * 1e3)
    return cost


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [100, 500]
    for n in sizes:
        cost = run(n)
        total = [a + b + c for a, b, c in zip(cost["receive"], cost["inbound"], cost["outbound"])]
        parts = ", ".join(f"{name} {statistics.median(v):.2f}" for name, v in cost.items())
        p99 = sorted(total)[int(0.99 * len(total))]
        print(
            f"{n:4d} PCMU calls: per tick median {statistics.median(total):.2f} ms (p99 {p99:.2f} ms; {parts}); "
            f"{statistics.median(total) * 1e3 / n:.1f} µs per call-tick"
        )


if __name__ == "__main__":
    main()
