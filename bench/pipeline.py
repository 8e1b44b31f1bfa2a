"""Benchmark of the cascaded pipeline through the real session core, with loopback fakes: ``python -m bench.pipeline``.

Each call is a real :class:`gateway.session.CallSession` on a real :class:`PipelineModel` (scripted recogniser,
the fake Chat Completions server over HTTP in a child process, the synthetic voice), driven by one 20 ms tick at
absolute deadlines that pushes caller frames and pulls agent frames, as the worker's media tick does.

``latency``  caller's last speech frame -> first agent frame pulled, minus ``endpoint_ms`` (gateway-added
             latency; with ``--stt-ms/--ttft-ms/--token-ms/--tts-ms`` the vendors' delays are scripted and the
             overlap of the stages shows against their sum).
``cpu``      process CPU per call (percent of one core) for N concurrent calls at 40 % caller talk time; the fake
             chat server runs in its own process and is not counted.
``barge-in`` agent frames pulled in the ticks after the core's barge-in (playout must stop in the same tick),
             and when the TTS stream was cancelled and the chat stream closed, from the core's barge-in
             (negative: the pipeline cancelled before the core had taken its SpeechStarted).

Prints one JSON object per run. Results and the machine they ran on: docs/performance/2026-12-07-pipeline.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import socket
import statistics
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar

import httpx
import numpy as np

from bench._control import NullControl
from gateway.providers.base import (
    AgentProfile,
    ComponentSpec,
    PipelineSpec,
)
from gateway.providers.fakes.fake_chat import FakeChatServer, ScriptedReply
from gateway.providers.pipeline import components
from gateway.providers.pipeline.chat import ChatConfig, OpenAICompatibleChat
from gateway.providers.pipeline.components import ComponentContext
from gateway.providers.pipeline.model import PipelineModel
from gateway.providers.pipeline.ports import LlmEvent
from gateway.providers.pipeline.synthetic import SyntheticStream, SyntheticTts, voice
from gateway.session import CallSession, SessionConfig
from gateway.session.events import BargedIn
from telcodecs.frames import Frame

TICK_S = 0.02
ENDPOINT_MS = 300


# ------------------------------------------------------------------------------------------- the fakes


def _serve_chat(port: int, reply: str, ttft_s: float, token_s: float) -> None:
    async def main() -> None:
        def default(_body: Any) -> ScriptedReply:
            return ScriptedReply(text=reply, ttft_s=ttft_s, token_s=token_s)

        async with FakeChatServer(default=default, port=port):
            await asyncio.Future()

    asyncio.run(main())


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def chat_process(reply: str, *, ttft_s: float = 0.0, token_s: float = 0.0) -> AsyncIterator[str]:
    """The fake chat server in a child process (its CPU is not the gateway's); yields its API base URL."""
    port = _free_port()
    context = multiprocessing.get_context("spawn")
    process = context.Process(target=_serve_chat, args=(port, reply, ttft_s, token_s), daemon=True)
    process.start()
    url = f"http://127.0.0.1:{port}/v1"
    try:
        async with httpx.AsyncClient(trust_env=False) as client:
            deadline = time.monotonic() + 20.0
            while True:
                with contextlib.suppress(httpx.HTTPError):
                    if (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError("the fake chat server did not start")
                await asyncio.sleep(0.05)
        yield url
    finally:
        process.terminate()
        process.join(5.0)


class _TimedTts(SyntheticTts):
    """The synthetic voice, noting when a stream is cancelled."""

    cancels: ClassVar[list[float]] = []

    async def open(self, utterance_id: str, *, voice: str = "") -> SyntheticStream:
        stream = await super().open(utterance_id, voice=voice)
        original = stream.cancel

        async def cancel() -> None:
            _TimedTts.cancels.append(time.monotonic())
            await original()

        stream.cancel = cancel  # type: ignore[method-assign]
        return stream


async def _timed_tts(spec: ComponentSpec, context: ComponentContext) -> Any:
    return _TimedTts(
        ms_per_char=int(spec.options.get("ms_per_char", 60)), first_audio_ms=int(spec.options.get("first_audio_ms", 0))
    )


class _TimedChat(OpenAICompatibleChat):
    """The chat client, noting when a stream is closed (a cancel reaches it as the generator's close)."""

    closes: ClassVar[list[float]] = []

    def stream(self, messages: Any, tools: Any, *, model: str = "") -> AsyncIterator[LlmEvent]:
        inner = super().stream(messages, tools, model=model)

        async def timed() -> AsyncIterator[LlmEvent]:
            try:
                async for event in inner:
                    yield event
            finally:
                _TimedChat.closes.append(time.monotonic())

        return timed()


async def _timed_chat(spec: ComponentSpec, context: ComponentContext) -> Any:
    return _TimedChat(ChatConfig(url=context.llm_url, model=context.llm_model))


components.register("tts", "bench-synthetic", _timed_tts, options=("ms_per_char", "first_audio_ms"))
components.register("llm", "bench-chat", _timed_chat)


def _model(url: str, *, stt_ms: int, tts_ms: int, texts: str, llm: str = "openai-compatible") -> PipelineModel:
    spec = PipelineSpec(
        stt=ComponentSpec(name="scripted", options={"texts": texts, "final_delay_ms": stt_ms}),
        llm=ComponentSpec(name=llm),
        tts=ComponentSpec(name="bench-synthetic", options={"ms_per_char": 60, "first_audio_ms": tts_ms}),
        endpoint_ms=ENDPOINT_MS,
        min_interrupt_ms=400,
    )
    return PipelineModel(spec, ComponentContext(llm_url=url, llm_model="bench"))


# --------------------------------------------------------------------------------------------- a caller


class Caller:
    """One call: a CallSession plus the caller's script of speech and silence, in 20 ms frames."""

    def __init__(self, index: int, model: PipelineModel, *, talk_ms: int, pause_ms: int) -> None:
        self.session = CallSession(
            call_id=f"bench-{index}",
            profile=AgentProfile(name="bench", provider="pipeline", instructions="Be brief."),
            model=model,  # type: ignore[arg-type]
            control=NullControl(),
            config=SessionConfig(),
        )
        speech = np.frombuffer(voice(talk_ms, seed=index), dtype="<i2")
        self.speech = [speech[i : i + 480] for i in range(0, speech.size - 479, 480)]
        self.pause_frames = pause_ms // 20
        self.frame = 0
        self.position = (index * 7) % (len(self.speech) + self.pause_frames)  # calls not in lockstep
        self.last_speech_at: float | None = None
        self.waiting = False
        self.latencies: list[float] = []
        self.internal: list[float] = []  # inside the pipeline: its last speech window -> its first reply audio
        self.model = model
        self.agent_frames = 0
        self.frames_after_barge_in = 0

    def tick(self, now: float) -> None:
        cycle = len(self.speech) + self.pause_frames
        slot = self.position % cycle
        pcm = self.speech[slot] if slot < len(self.speech) else np.zeros(480, dtype=np.int16)
        self.session.push_inbound(Frame(index=self.frame, pcm=pcm))
        if slot == len(self.speech) - 1:
            self.last_speech_at, self.waiting = now, True
        out = self.session.pull_outbound()
        if out is not None:
            self.agent_frames += 1
            if self.waiting and self.last_speech_at is not None:
                self.latencies.append((now - self.last_speech_at) * 1000.0 - ENDPOINT_MS)
                self.waiting = False
                live = [s for s in self.model.sessions if not s.closed]
                pipeline = live[-1] if live else None
                if pipeline is not None and pipeline.first_audio_at and pipeline.last_speech_at:
                    self.internal.append((pipeline.first_audio_at - pipeline.last_speech_at) * 1000.0 - ENDPOINT_MS)
        self.frame += 1
        self.position += 1


async def run_ticks(callers: list[Caller], seconds: float, on_tick: Callable[[float], None] | None = None) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    for step in range(int(seconds / TICK_S)):
        deadline = start + step * TICK_S
        delay = deadline - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        now = time.monotonic()
        for caller in callers:
            caller.tick(now)
        if on_tick is not None:
            on_tick(now)


def _percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {
        "n": len(ordered),
        "p50": round(statistics.median(ordered), 1),
        "p95": round(ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))], 1),
        "max": round(ordered[-1], 1),
    }


# --------------------------------------------------------------------------------------------- the runs


async def latency(args: argparse.Namespace) -> dict[str, Any]:
    async with chat_process(args.reply, ttft_s=args.ttft_ms / 1000, token_s=args.token_ms / 1000) as url:
        model = _model(url, stt_ms=args.stt_ms, tts_ms=args.tts_ms, texts="hello there")
        caller = Caller(0, model, talk_ms=800, pause_ms=args.pause_ms)
        await caller.session.start()
        await run_ticks([caller], args.turns * (0.8 + args.pause_ms / 1000))
        await caller.session.aclose()
    scripted = args.stt_ms + args.ttft_ms + args.tts_ms
    tokens = len(args.reply.split())
    return {
        "run": "latency",
        "endpoint_ms": ENDPOINT_MS,
        "scripted_delays_ms": {"stt_final": args.stt_ms, "llm_ttft": args.ttft_ms, "tts_ttfb": args.tts_ms},
        "scripted_sum_ms": scripted,
        "reply_stream_ms": tokens * args.token_ms,
        "sequential_would_be_ms": scripted + tokens * args.token_ms,
        "added_ms": _percentiles(caller.latencies),
        "added_beyond_scripted_ms": _percentiles([v - scripted for v in caller.latencies]),
        "inside_pipeline_beyond_scripted_ms": _percentiles([v - scripted for v in caller.internal]),
    }


async def cpu(args: argparse.Namespace) -> dict[str, Any]:
    async with chat_process("Okay, noted.") as url:
        model = _model(url, stt_ms=0, tts_ms=0, texts="hello there")
        callers = [Caller(i, model, talk_ms=1200, pause_ms=1800) for i in range(args.calls)]
        for caller in callers:
            await caller.session.start()
        await run_ticks(callers, 3.0)  # warm up: connections, first turns
        cpu0, wall0 = time.process_time(), time.monotonic()
        await run_ticks(callers, args.seconds)
        cpu_s, wall_s = time.process_time() - cpu0, time.monotonic() - wall0
        turns = sum(len(c.latencies) for c in callers)
        for caller in callers:
            await caller.session.aclose()
    return {
        "run": "cpu",
        "calls": args.calls,
        "seconds": round(wall_s, 1),
        "turns_answered": turns,
        "cpu_percent_of_a_core_per_call": round(100.0 * cpu_s / wall_s / args.calls, 2),
        "note": "includes the session core, tick loop, scripted STT and synthetic TTS; not the fake chat server",
    }


async def barge_in(args: argparse.Namespace) -> dict[str, Any]:
    long = " ".join(["This is a long answer that keeps going so that the caller can cut in."] * 4)
    async with chat_process(long, token_s=0.03) as url:  # still streaming when the caller cuts in
        model = _model(url, stt_ms=0, tts_ms=0, texts="tell me everything|stop", llm="bench-chat")
        caller = Caller(0, model, talk_ms=600, pause_ms=1400)  # speaks again 2 s later: over the agent
        await caller.session.start()
        ring = caller.session.events
        last_id = 0
        barged_at: list[float] = []  # the core's BargedIn records (session clock: time.monotonic)
        after: list[int] = []  # agent frames pulled in the 5 ticks after each barge-in (playout stopped: 0)
        window = 0
        frames_before = 0
        _TimedTts.cancels.clear()
        _TimedChat.closes.clear()

        def on_tick(now: float) -> None:
            nonlocal last_id, frames_before, window
            if window:
                after[-1] += caller.agent_frames - frames_before
                window -= 1
            records, _gap = ring.events_since(last_id)
            for record in records:
                last_id = record.id
                if isinstance(record.event, BargedIn):
                    barged_at.append(record.at)
                    after.append(0)
                    window = 5
            frames_before = caller.agent_frames

        await run_ticks([caller], args.turns * 2.0, on_tick=on_tick)
        await caller.session.aclose()

    def delays(ends: list[float]) -> list[float]:
        # The pipeline cancels as it emits SpeechStarted, so a cancel may complete before the core's BargedIn.
        found = []
        for start in barged_at:
            near = [end for end in ends if abs(end - start) < 0.5]
            if near:
                found.append((min(near, key=lambda end: abs(end - start)) - start) * 1000.0)
        return found

    return {
        "run": "barge-in",
        "barge_ins": len(barged_at),
        "agent_frames_after_barge_in": after,
        "tts_cancel_after_barge_in_ms": _percentiles(delays(_TimedTts.cancels)),
        "chat_closed_after_barge_in_ms": _percentiles(delays(_TimedChat.closes)),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="run", required=True)
    lat = sub.add_parser("latency")
    lat.add_argument("--turns", type=int, default=20)
    lat.add_argument("--pause-ms", type=int, default=2200, help="caller silence after each turn")
    lat.add_argument("--stt-ms", type=int, default=0)
    lat.add_argument("--ttft-ms", type=int, default=0)
    lat.add_argument("--token-ms", type=int, default=0)
    lat.add_argument("--tts-ms", type=int, default=0)
    lat.add_argument("--reply", default="Okay.", help="the chat model's reply (streamed word by word)")
    c = sub.add_parser("cpu")
    c.add_argument("--calls", type=int, default=10)
    c.add_argument("--seconds", type=float, default=20.0)
    b = sub.add_parser("barge-in")
    b.add_argument("--turns", type=int, default=10)


def main(args: argparse.Namespace) -> int:
    run = {"latency": latency, "cpu": cpu, "barge-in": barge_in}[args.run]
    print(json.dumps(asyncio.run(run(args))))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    raise SystemExit(main(parser.parse_args()))
