"""CPU per call-frame of a call answered by a websocket bot, against an echo call: ``python -m bench.websocket_bot``.

``calls`` sessions of the real session core (:class:`gateway.session.session.CallSession`) run in this process,
driven by a 20 ms tick at absolute deadlines as the worker drives them: each tick every call gets one caller frame
(``push_inbound``, a PCMU caller's frame: 24 kHz PCM and its 160 u-law codes) and gives one frame back
(``pull_outbound``). What answers:

* ``echo``: the built-in echo agent (in process, no socket; ``pcm24k``, the only format it speaks);
* ``websocket pcmu``: the ``websocket`` provider, one stream per call to an echo bot (the fake bot of
  :mod:`gateway.providers.media_stream.fake_bot` with ``echo=True``) in a separate process on loopback, the
  profile's ``audio_format = "pcmu"``: the caller's codes go to the bot as they are and come back as they are;
* ``websocket pcm24k``: the same with the default ``pcm24k`` profile: 24 kHz <-> 8 kHz u-law in the provider.

The figure is this process's CPU time (user + system, every thread) over the measured ticks, divided by
calls x ticks: microseconds of the gateway's CPU per call per 20 ms. The bot's own CPU is in another process
and is reported apart. The media tick's own DSP (jitter buffer, decode, resample, encode, RTP) is the same for
every kind and is not part of this figure (``gateway bench codecs`` and ``calls`` measure it). ``add_arguments``
and ``main`` are what a ``gateway bench websocket-bot`` subcommand needs. Results and the machine they ran on:
docs/performance/2026-12-07-websocket-bot.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from bench._control import NullControl
from gateway.providers.base import AgentProfile, BotSpec, RealtimeModel
from gateway.providers.echo import EchoModel
from gateway.providers.media_stream.session import BotConfig, WebsocketBotModel
from gateway.session.config import SessionConfig
from gateway.session.session import CallSession
from telcodecs.frames import FRAME_SAMPLES, Frame
from telcodecs.g711 import ulaw_decode

KINDS = ("echo", "websocket pcmu", "websocket pcm24k")
ROOT = Path(__file__).resolve().parents[1]  # the repository: where ``-m bench.websocket_bot`` is found
TICK_S = 0.02


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    kind: str
    calls: int
    ticks: int
    us_per_call_frame: float
    frames_back: float  # share of pulled frames that carried the agent's audio (1.0: every tick heard the echo)
    bot_cpu_s: float


def caller_frames(count: int = 50) -> list[tuple[np.ndarray, bytes]]:
    """A second of a PCMU caller: a 440 Hz tone's u-law codes and the 24 kHz PCM a tick would decode them to."""
    t = np.arange(count * 160) / 8000
    codes = (np.round(127 + 100 * np.sin(2 * np.pi * 440 * t)) % 256).astype(np.uint8).tobytes()
    frames = []
    for i in range(count):
        chunk = codes[i * 160 : (i + 1) * 160]
        pcm = np.repeat(ulaw_decode(chunk), 3)[:FRAME_SAMPLES].astype(np.int16)
        pcm.flags.writeable = False
        frames.append((pcm, chunk))
    return frames


def model_for(kind: str, bot_url: str) -> tuple[RealtimeModel, AgentProfile]:
    if kind == "echo":
        return EchoModel(), AgentProfile(name="echo", provider="echo")
    audio_format = "pcmu" if kind.endswith("pcmu") else "pcm24k"
    profile = AgentProfile(name="bot", provider="websocket", audio_format=audio_format, bot=BotSpec(url=bot_url))
    return WebsocketBotModel(BotConfig(url=bot_url)), profile


async def measure(kind: str, *, calls: int, seconds: float, warmup_s: float, bot_url: str, bot_pid: int) -> Result:
    model, profile = model_for(kind, bot_url)
    config = SessionConfig()
    sessions = [
        CallSession(
            call_id=f"bench-{i}",
            profile=profile,
            model=model,
            control=NullControl(),
            config=config,
        )
        for i in range(calls)
    ]
    await asyncio.gather(*(s.start() for s in sessions))
    frames = caller_frames()
    bot = psutil.Process(bot_pid) if bot_pid else None
    loop = asyncio.get_running_loop()
    warmup_ticks = round(warmup_s / TICK_S)
    ticks = round(seconds / TICK_S)
    heard = 0
    cpu_start = bot_start = 0.0
    deadline = loop.time()
    try:
        for tick in range(warmup_ticks + ticks):
            if tick == warmup_ticks:
                cpu_start = time.process_time()
                bot_start = _cpu(bot)
            pcm, codes = frames[tick % len(frames)]
            measuring = tick >= warmup_ticks
            for session in sessions:
                if session.pull_outbound(takes_g711=True) is not None and measuring:
                    heard += 1
                session.push_inbound(Frame(index=tick, pcm=pcm, g711=codes, g711_law="pcmu"))
            deadline += TICK_S
            await asyncio.sleep(max(0.0, deadline - loop.time()))
        cpu = time.process_time() - cpu_start
        bot_cpu = _cpu(bot) - bot_start
    finally:
        await asyncio.gather(*(s.aclose("bench done") for s in sessions))
    return Result(
        kind=kind,
        calls=calls,
        ticks=ticks,
        us_per_call_frame=cpu / (calls * ticks) * 1e6,
        frames_back=heard / (calls * ticks),
        bot_cpu_s=bot_cpu,
    )


def _cpu(process: psutil.Process | None) -> float:
    if process is None:
        return 0.0
    times = process.cpu_times()
    return float(times.user + times.system)


def serve_bot(port: int) -> None:
    """The echo bot, in its own process (``--serve-bot PORT``): its CPU is not the gateway's."""
    from gateway.providers.media_stream.fake_bot import FakeBot

    async def serve() -> None:
        async with FakeBot(echo=True, port=port):
            print(f"echo bot on ws://127.0.0.1:{port}/stream", flush=True)
            await asyncio.Event().wait()

    asyncio.run(serve())


def start_bot() -> tuple[subprocess.Popen[bytes], str]:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.websocket_bot", "--serve-bot", str(port)],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ},
    )
    assert process.stdout is not None
    line = process.stdout.readline().decode()  # the bot says where it listens once it does
    if "echo bot on" not in line:
        process.kill()
        raise RuntimeError(f"the echo bot did not start: {line!r}")
    return process, f"ws://127.0.0.1:{port}/stream"


def run(*, calls: int, seconds: float, warmup_s: float, repeats: int) -> dict[str, Any]:
    bot, url = start_bot()
    try:
        results: dict[str, list[Result]] = {kind: [] for kind in KINDS}
        for _ in range(repeats):  # interleaved, so a neighbour's load spreads over every kind
            for kind in KINDS:
                result = asyncio.run(
                    measure(kind, calls=calls, seconds=seconds, warmup_s=warmup_s, bot_url=url, bot_pid=bot.pid)
                )
                results[kind].append(result)
    finally:
        bot.terminate()
        bot.wait(timeout=10)
    summary: dict[str, Any] = {"calls": calls, "seconds": seconds, "repeats": repeats, "kinds": {}}
    for kind, runs in results.items():
        summary["kinds"][kind] = {
            "us_per_call_frame": statistics.median(r.us_per_call_frame for r in runs),
            "runs_us": [round(r.us_per_call_frame, 1) for r in runs],
            "frames_back": min(r.frames_back for r in runs),
            "bot_us_per_call_frame": statistics.median(r.bot_cpu_s / (r.calls * r.ticks) * 1e6 for r in runs),
        }
    return summary


def table(summary: dict[str, Any]) -> str:
    echo = summary["kinds"]["echo"]["us_per_call_frame"]
    lines = [
        f"{summary['calls']} calls, {summary['seconds']:g} s measured, median of {summary['repeats']}",
        f"{'answered by':<18} {'µs/call-frame':>14} {'x echo':>7} {'frames back':>12} {'bot µs/call-frame':>18}",
    ]
    for kind, figures in summary["kinds"].items():
        us = figures["us_per_call_frame"]
        lines.append(
            f"{kind:<18} {us:>14.1f} {us / echo:>7.2f} {figures['frames_back']:>12.3f} "
            f"{figures['bot_us_per_call_frame']:>18.1f}"
        )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=50, help="concurrent calls")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of every kind (median reported)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def main(args: argparse.Namespace) -> int:
    summary = run(calls=args.calls, seconds=args.seconds, warmup_s=args.warmup, repeats=args.repeats)
    print(json.dumps(summary, indent=2) if args.json else table(summary))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve-bot", type=int, metavar="PORT", help=argparse.SUPPRESS)
    add_arguments(parser)
    parsed = parser.parse_args()
    if parsed.serve_bot:
        serve_bot(parsed.serve_bot)
    else:
        sys.exit(main(parsed))
