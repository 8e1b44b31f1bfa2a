"""CPU per call-frame of output guardrails, against the same calls without them: ``gateway bench guardrails``.

``calls`` sessions of the real session core (:class:`gateway.session.session.CallSession`) run in this process with
the OpenAI adapter, each on its own websocket to the fake OpenAI server (``gateway fake-provider``, a separate
process, so its CPU is not counted), driven by a 20 ms tick at absolute deadlines as the worker drives them: each
tick every call gets one (silent) caller frame and gives one frame back. Each call asks for one long reply
(``reply`` seconds of paced tone) whose transcript streams beside its audio as the real service's does: about
fifteen characters a second of ordinary agent talk, with numbers in it, and nothing any guardrail blocks, so every
check point runs every check and none trips.

Kinds: ``none`` (no guardrails), ``built-in`` (a blocked list of 20 phrases and 5 patterns, and the PII check),
at the default debounce (every 40 characters and at sentence ends). The figure is this process's CPU time over
the measured ticks divided by calls x ticks; kinds run interleaved and the median of the repeats is reported.
Results and the machine: docs/performance/2026-12-07-guardrails.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

import numpy as np

from bench._control import NullControl
from gateway.providers.base import AgentProfile
from gateway.providers.openai import OpenAIConfig, OpenAIRealtimeModel
from gateway.session.config import GuardrailConfig, SessionConfig
from gateway.session.session import CallSession
from telcodecs.frames import FRAME_SAMPLES, Frame

KINDS = ("none", "built-in")
TICK_S = 0.02
SENTENCES = (
    "Thanks for calling, I can help with that order today.",
    "Your order number four five seven two left our warehouse yesterday morning.",
    "The courier expects to deliver it on Friday before noon, to 221 Baker Street.",
    "If nobody is home they will leave a card with a number to call, 555 0100.",
    "Is there anything else I can check for you while we are on the line?",
)
BLOCKED = GuardrailConfig(
    name="blocked",
    kind="blocked",
    phrases=tuple(f"competitor {name}" for name in "abcdefghijklmnopqrst"),
    patterns=(r"\bguarantee(d)?\b", r"\bfree\s+money\b", r"\binsider\b", r"\bwire\s+transfer\b", r"\bpassword\b"),
)
PII = GuardrailConfig(name="pii", kind="pii")


def transcript(seconds: float) -> str:
    """Agent talk at about fifteen characters a second."""
    text = ""
    while len(text) < 15 * seconds:
        text += " ".join(SENTENCES) + " "
    return text[: int(15 * seconds)].rsplit(" ", 1)[0]


async def measure(kind: str, *, url: str, calls: int, seconds: float, warmup_s: float) -> float:
    config = SessionConfig()
    if kind == "built-in":
        config = replace(config, guardrails=(BLOCKED, PII))
    model = OpenAIRealtimeModel(OpenAIConfig(url=url))
    profile = AgentProfile(name="bench", provider="openai")
    sessions = [
        CallSession(call_id=f"bench-{i}", profile=profile, model=model, control=NullControl(), config=config)
        for i in range(calls)
    ]
    await asyncio.gather(*(s.start() for s in sessions))
    for session in sessions:
        session.inject("Where is my order?", role="user", respond=True)
    silence = np.zeros(FRAME_SAMPLES, dtype=np.int16)
    silence.flags.writeable = False
    loop = asyncio.get_running_loop()
    warmup_ticks, ticks = round(warmup_s / TICK_S), round(seconds / TICK_S)
    cpu_start = 0.0
    deadline = loop.time()
    try:
        for tick in range(warmup_ticks + ticks):
            if tick == warmup_ticks:
                cpu_start = time.process_time()
            for session in sessions:
                session.pull_outbound()
                session.push_inbound(Frame(index=tick, pcm=silence))
            deadline += TICK_S
            await asyncio.sleep(max(0.0, deadline - loop.time()))
        cpu = time.process_time() - cpu_start
        trips = sum(len(s.guardrail_trips) for s in sessions)
        if trips:
            raise RuntimeError(f"{trips} guardrail trips: the bench's talk must trip nothing")
    finally:
        await asyncio.gather(*(s.aclose("bench done") for s in sessions))
    return cpu / (calls * ticks) * 1e6


def start_fake(reply_s: float, text: str) -> tuple[subprocess.Popen[bytes], str]:
    argv = [sys.executable, "-m", "gateway", "fake-provider", "--port", "0", "--mode", "tone", "--paced"]
    argv += ["--reply-ms", str(int(reply_s * 1000)), "--chunk-ms", "100", "--record", "none"]
    argv += ["--reply-transcript", text]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert process.stdout is not None
    for _ in range(50):
        line = process.stdout.readline().decode()
        found = re.search(r"listening (ws://127\.0\.0\.1:\d+/v1/realtime)", line)
        if found:
            return process, found.group(1)
    process.kill()
    raise RuntimeError("the fake provider did not start")


def run(*, calls: int, seconds: float, warmup_s: float, repeats: int) -> dict[str, Any]:
    reply_s = warmup_s + seconds + 5
    fake, url = start_fake(reply_s, transcript(reply_s))
    try:
        runs: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for _ in range(repeats):  # interleaved, so a neighbour's load spreads over both kinds
            for kind in KINDS:
                runs[kind].append(asyncio.run(measure(kind, url=url, calls=calls, seconds=seconds, warmup_s=warmup_s)))
    finally:
        fake.terminate()
        fake.wait(timeout=10)
    return {
        "calls": calls,
        "seconds": seconds,
        "repeats": repeats,
        "kinds": {
            kind: {"us_per_call_frame": statistics.median(values), "runs_us": [round(v, 1) for v in values]}
            for kind, values in runs.items()
        },
    }


def table(summary: dict[str, Any]) -> str:
    base = summary["kinds"]["none"]["us_per_call_frame"]
    lines = [
        f"{summary['calls']} calls, {summary['seconds']:g} s measured, median of {summary['repeats']}",
        f"{'guardrails':<10} {'µs/call-frame':>14} {'x none':>7} {'runs':>24}",
    ]
    for kind, figures in summary["kinds"].items():
        us = figures["us_per_call_frame"]
        lines.append(f"{kind:<10} {us:>14.1f} {us / base:>7.3f} {figures['runs_us']!s:>24}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=20, help="concurrent calls")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved runs of each kind (median reported)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")


def main(args: argparse.Namespace) -> int:
    summary = run(calls=args.calls, seconds=args.seconds, warmup_s=args.warmup, repeats=args.repeats)
    print(json.dumps(summary, indent=2) if args.json else table(summary))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
