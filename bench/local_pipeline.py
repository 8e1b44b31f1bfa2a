"""``gateway bench local-pipeline``: the local pipeline's turn latency and CPU per call, no keys, no network.

Each simulated call is a caller speaking the ten espeak-ng fixture sentences (en-us, 150 wpm) as 20 ms frames of
24 kHz PCM in real time, at absolute deadlines, each followed by silence so the caller talks ``--talk`` of the
time (0.4 by default). The agent is the local default: silero VAD, Whisper tiny.en (one model for the process,
decoded in the bounded pool), the rule agent and espeak-ng.

``--via components`` (the default until the pipeline session is on main) drives the components the way the
session does: caller frames resampled 24 -> 16 kHz by telcodecs, the VAD's silence for ``--endpoint-ms`` after
speech calls the STT's ``finalize()``, the final text goes to the rule agent, its text to an espeak stream.

``gateway bench local-pipeline --wer [--context-s-list S ...]`` instead decodes the ten sentences alone, straight at
16 kHz and through a G.711 phone's path (24 -> 8 kHz, mu-law both ways, back to 24 and 16 kHz by telcodecs), and
reports the word error rate and the CPU per decode for each audio context.

Figures, per turn: **end of caller speech** (the moment the last frame holding speech was fed) to **first agent
audio** (the first TtsAudio of the reply), p50 and p95 over all turns of all calls; and the process's CPU time
(all threads) over the run, per call, as a share of one core, which is what admission should count.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from gateway.providers.pipeline.local.espeak import EspeakConfig, EspeakTts
from gateway.providers.pipeline.local.rules import RuleAgent
from gateway.providers.pipeline.local.stt import LocalWhisperStt
from gateway.providers.pipeline.local.vad import SileroVad
from gateway.providers.pipeline.local.whisper import WhisperConfig, WhisperRuntime, load_whisper, shared_whisper
from gateway.providers.pipeline.ports import ChatMessage, SttFinal, TextDelta, TtsAudio
from gateway.session.config import SessionConfig
from gateway.session.tools import ToolRegistry
from telcodecs import g711
from telcodecs.resample import StreamResampler

FRAME = 480  # 20 ms at 24 kHz
# The project's ten call-centre fixtures, as in tests/gateway/providers/pipeline/local/speech.py.
SENTENCES = (
    "Hello, I would like to check my order status.",
    "My order number is four five seven two.",
    "I was charged twice for the same item.",
    "Can you transfer me to a human agent please?",
    "The package never arrived at my address.",
    "I need to change my delivery date to Friday.",
    "Please cancel my subscription today.",
    "What is the balance on my account?",
    "My phone number is five five five one two three four.",
    "Thank you very much, goodbye.",
)
SPEECH_DBFS = -45.0


@dataclass(slots=True)
class Turn:
    sentence: str
    heard: str = ""
    latency_s: float | None = None  # end of caller speech -> first agent audio
    decode_s: float | None = None  # finalize() -> SttFinal


@dataclass(slots=True)
class CallResult:
    turns: list[Turn] = field(default_factory=list)
    seconds: float = 0.0


def _frames(pcm: np.ndarray) -> list[bytes]:  # type: ignore[type-arg]
    pad = np.concatenate([pcm.astype(np.int16), np.zeros(-len(pcm) % FRAME, dtype=np.int16)])
    return [pad[i : i + FRAME].astype("<i2").tobytes() for i in range(0, len(pad), FRAME)]


def _last_speech_frame(frames: list[bytes]) -> int:
    floor = 32768.0 * 10 ** (SPEECH_DBFS / 20)
    loud = [
        i for i, f in enumerate(frames) if np.sqrt(np.mean(np.frombuffer(f, "<i2").astype(np.float64) ** 2)) > floor
    ]
    return loud[-1] if loud else len(frames) - 1


async def _caller_audio(tts: EspeakTts) -> list[tuple[str, list[bytes]]]:
    out = []
    for i, sentence in enumerate(SENTENCES):
        stream = await tts.open(f"caller-{i}")
        await stream.push(sentence)
        await stream.flush()
        pcm = b"".join([e.pcm async for e in stream.events() if isinstance(e, TtsAudio)])
        out.append((sentence, _frames(np.frombuffer(pcm, "<i2"))))
    return out


async def run_call(
    index: int,
    speech: list[tuple[str, list[bytes]]],
    runtime: WhisperRuntime,
    tts: EspeakTts,
    *,
    endpoint_ms: int,
    talk: float,
) -> CallResult:
    """One caller against the local components, in real time."""
    loop = asyncio.get_running_loop()
    vad = SileroVad()
    stt = LocalWhisperStt(runtime, SileroVad())
    agent = RuleAgent()
    tools = ToolRegistry.from_config(SessionConfig()).resolve(())
    to_16k = StreamResampler(24000, 16000)
    history: list[ChatMessage] = []
    result = CallResult()
    turn: Turn | None = None
    speech_end_at = 0.0
    finalized_at = 0.0
    replied = asyncio.Event()
    speaking = False
    silence_ms = 0

    async def reply(final: SttFinal) -> None:
        assert turn is not None
        turn.decode_s = loop.time() - finalized_at
        turn.heard = final.text
        history.append(ChatMessage(role="user", content=final.text))
        stream = await tts.open(f"call{index}-reply{len(result.turns)}")
        async for event in agent.stream(history, tools):
            if isinstance(event, TextDelta):
                await stream.push(event.text)
        await stream.flush()
        async for out in stream.events():
            if isinstance(out, TtsAudio) and turn.latency_s is None:
                turn.latency_s = loop.time() - speech_end_at
        replied.set()

    async def read_stt() -> None:
        async for event in stt.events():
            if isinstance(event, SttFinal) and event.from_finalize:
                await reply(event)

    reader = loop.create_task(read_stt(), name=f"bench-call{index}-stt")
    started = loop.time()
    deadline = started
    try:
        for sentence, frames in speech:
            turn = Turn(sentence=sentence)
            result.turns.append(turn)
            replied.clear()
            last = _last_speech_frame(frames)
            gap = int(len(frames) * (1 / talk - 1))
            for n, frame in enumerate([*frames, *[bytes(FRAME * 2)] * gap]):
                deadline += 0.02
                await asyncio.sleep(max(0.0, deadline - loop.time()))
                pcm16 = to_16k.process(np.frombuffer(frame, "<i2").astype(np.int16)).tobytes()
                stt.feed(pcm16)
                if n == last:
                    speech_end_at = loop.time()
                for activity in vad.feed(pcm16):
                    if activity.speech:
                        speaking, silence_ms = True, 0
                    elif speaking:
                        silence_ms += vad.window_ms
                        if silence_ms >= endpoint_ms:
                            speaking = False
                            finalized_at = loop.time()
                            stt.finalize()
            await asyncio.wait_for(replied.wait(), timeout=30)
    finally:
        result.seconds = loop.time() - started
        await stt.aclose()
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    return result


_DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def normalise(text: str) -> list[str]:
    """Lower case, punctuation stripped, digits as words, "good bye" as "goodbye" (PIPELINE.md §3.2)."""
    text = text.lower().replace("-", " ")
    text = re.sub(r"\d", lambda m: f" {_DIGITS[int(m.group())]} ", text)
    return re.sub(r"[^a-z' ]", " ", text).replace("good bye", "goodbye").split()


def word_errors(reference: str, hypothesis: str) -> int:
    ref, hyp = normalise(reference), normalise(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        previous, row[0] = row[:], i
        for j, h in enumerate(hyp, 1):
            row[j] = min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (r != h))
    return row[-1]


def _through(pcm: np.ndarray, *rates: int) -> np.ndarray:  # type: ignore[type-arg]
    for a, b in itertools.pairwise(rates):
        resampler = StreamResampler(a, b)
        frame = resampler.in_frame
        pcm = np.concatenate([pcm, np.zeros(-len(pcm) % frame, dtype=np.int16)])
        pcm = np.concatenate([resampler.process(pcm[i : i + frame]) for i in range(0, len(pcm), frame)])
    return pcm


async def wer_async(args: argparse.Namespace) -> dict[str, Any]:
    tts = EspeakTts(EspeakConfig(voice="en-us", wpm=150))
    try:
        speech = await _caller_audio(tts)
    finally:
        await tts.aclose()
    wide = {s: _through(np.frombuffer(b"".join(f), "<i2").astype(np.int16), 24000, 16000) for s, f in speech}
    narrow = {}
    for sentence, frames in speech:
        pcm8 = _through(np.frombuffer(b"".join(frames), "<i2").astype(np.int16), 24000, 8000)
        narrow[sentence] = _through(g711.ulaw_decode(g711.ulaw_encode(pcm8)), 8000, 24000, 16000)
    results = []
    for context_s in args.context_s_list:
        runtime = load_whisper(WhisperConfig(context_s=context_s, workers=1, threads=args.threads))
        runtime.decode(np.zeros(16000, np.int16))
        row: dict[str, Any] = {"context_s": context_s}
        for name, audio in (("16k", wide), ("mulaw", narrow)):
            errors = words = 0
            cpu0 = time.process_time()
            texts = {}
            for sentence in SENTENCES:
                texts[sentence] = runtime.decode(audio[sentence])
                errors += word_errors(sentence, texts[sentence])
                words += len(normalise(sentence))
            row[name] = {
                "wer": errors / words,
                "errors": errors,
                "words": words,
                "cpu_s_per_decode": (time.process_time() - cpu0) / len(SENTENCES),
            }
            if args.detail:
                row[name]["texts"] = texts
        runtime.close()
        results.append(row)
    speech_s = statistics.mean(len(a) / 16000 for a in wide.values())
    return {"mean_utterance_s": speech_s, "results": results}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    config = WhisperConfig(context_s=args.context_s, workers=args.workers, threads=args.threads)
    runtime = await shared_whisper(config)
    caller_tts = EspeakTts(EspeakConfig(voice="en-us", wpm=150))
    agent_tts = EspeakTts(EspeakConfig(voice="en-us", wpm=160))
    try:
        speech = await _caller_audio(caller_tts)
        await runtime.transcribe(np.zeros(16000, np.int16))  # first decode warms the model
        load_before = os.getloadavg()
        cpu0, wall0 = time.process_time(), time.perf_counter()
        calls = await asyncio.gather(
            *(
                run_call(i, speech, runtime, agent_tts, endpoint_ms=args.endpoint_ms, talk=args.talk)
                for i in range(args.calls)
            )
        )
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    finally:
        await caller_tts.aclose()
        await agent_tts.aclose()
    turns = [t for c in calls for t in c.turns]
    latencies = [t.latency_s for t in turns if t.latency_s is not None]
    decodes = [t.decode_s for t in turns if t.decode_s is not None]
    return {
        "via": "components",
        "calls": args.calls,
        "turns": len(turns),
        "endpoint_ms": args.endpoint_ms,
        "talk": args.talk,
        "whisper": {"context_s": config.context_s, "pool": config.pool_size, "threads": config.decode_threads},
        "latency_s": {
            "p50": statistics.median(latencies),
            "p95": _percentile(latencies, 0.95),
            "max": max(latencies),
        },
        "decode_s": {"p50": statistics.median(decodes), "p95": _percentile(decodes, 0.95)},
        "cpu_core_per_call": cpu / wall / args.calls,
        "cpu_s": cpu,
        "wall_s": wall,
        "env": {
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "python": platform.python_version(),
        },
        "turn_detail": [asdict(t) for t in turns] if args.detail else [],
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=1, help="concurrent calls (default 1)")
    parser.add_argument("--endpoint-ms", type=int, default=500)
    parser.add_argument("--talk", type=float, default=0.4, help="share of the call the caller talks")
    parser.add_argument("--context-s", type=float, default=15.0)
    parser.add_argument("--workers", type=int, default=0, help="decode pool size (0: the cores)")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads inside one decode")
    parser.add_argument("--detail", action="store_true", help="every turn's text and times")
    parser.add_argument("--wer", action="store_true", help="word error rate and decode CPU, no calls")
    parser.add_argument("--context-s-list", type=float, nargs="+", default=[10.0, 15.0, 30.0], help="with --wer")


def main(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    report = asyncio.run(wer_async(args) if args.wer else main_async(args))
    json.dump(report, sys.stdout, indent=2)
    print()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.local_pipeline", description=__doc__.split("\n")[0])
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
