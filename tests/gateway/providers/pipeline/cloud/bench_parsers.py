"""Per-message CPU cost of the cloud adapters' sans-I/O cores (docs/performance/2026-12-07-cloud-adapters.md).

Run: ``.venv/bin/python -m tests.gateway.providers.pipeline.cloud.bench_parsers [--messages N] [--repeats R]``.
Each case feeds realistic wire messages (JSON text as received, base64 audio included) through the core the
adapter's receive callback runs, and reports process CPU time per message: the median of R repeats of N messages.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import orjson
import pybase64

from gateway.providers.fakes import speech
from gateway.providers.pipeline.cloud.cartesia import CartesiaContext
from gateway.providers.pipeline.cloud.deepgram import DeepgramParser
from gateway.providers.pipeline.cloud.elevenlabs import ElevenAlignment, send_text
from gateway.providers.pipeline.cloud.openai_transcribe import TranscribeParser, append

TEXT = "Sure, your order shipped yesterday and it arrives on Friday before noon. "


def _deepgram_results() -> bytes:
    words = [
        {"word": w, "start": 0.3 * i, "end": 0.3 * i + 0.25, "confidence": 0.98, "punctuated_word": w}
        for i, w in enumerate(["my", "order", "number", "is", "four", "five", "seven", "two"])
    ]
    alt = {"transcript": " ".join(w["word"] for w in words), "confidence": 0.98, "words": words}
    return orjson.dumps(
        {
            "type": "Results",
            "channel_index": [0, 1],
            "duration": 2.4,
            "start": 10.0,
            "is_final": True,
            "speech_final": True,
            "channel": {"alternatives": [alt]},
            "metadata": {
                "request_id": "r",
                "model_uuid": "u",
                "model_info": {"name": "n", "version": "v", "arch": "a"},
            },
        }
    )


def _eleven_chunks() -> list[bytes]:
    """One clause as the fake sends it: 100 ms chunks of 24 kHz PCM, each with its characters' alignment."""
    pcm, words = speech.render(TEXT)
    times = speech.char_times(TEXT, words, len(pcm) // 48)
    chunks, placed = [], 0
    for index, first in enumerate(range(0, len(pcm), 4800)):
        piece_end = (index + 1) * 100
        chars, starts, durations = [], [], []
        while placed < len(TEXT) and times[placed][0] < piece_end:
            chars.append(TEXT[placed])
            starts.append(times[placed][0] - index * 100)
            durations.append(times[placed][1])
            placed += 1
        align = {"chars": chars, "charStartTimesMs": starts, "charDurationsMs": durations}
        message = {
            "audio": pybase64.b64encode(pcm[first : first + 4800]).decode(),
            "alignment": align,
            "normalizedAlignment": align,
            "contextId": "c",
        }
        chunks.append(orjson.dumps(message))
    return chunks


def _cartesia_messages() -> list[bytes]:
    pcm, words = speech.render(TEXT)
    out = []
    for first in range(0, len(pcm), 1920):  # 40 ms chunks
        out.append(
            orjson.dumps(
                {
                    "type": "chunk",
                    "context_id": "c",
                    "data": pybase64.b64encode(pcm[first : first + 1920]).decode(),
                    "done": False,
                    "status_code": 206,
                    "step_time": 10.0,
                }
            )
        )
    for word in words:
        out.append(
            orjson.dumps(
                {
                    "type": "timestamps",
                    "context_id": "c",
                    "done": False,
                    "status_code": 206,
                    "word_timestamps": {
                        "words": [word.text],
                        "start": [word.start_ms / 1000],
                        "end": [word.end_ms / 1000],
                    },
                }
            )
        )
    return out


def _measure(n: int, repeats: int, run: Callable[[int], None]) -> float:
    """Median CPU microseconds per message over ``repeats`` runs of ``n`` messages."""
    per_message = []
    for _ in range(repeats):
        start = time.process_time_ns()
        run(n)
        per_message.append((time.process_time_ns() - start) / n / 1000)
    return statistics.median(per_message)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    n, repeats = args.messages, args.repeats

    results = _deepgram_results()

    def deepgram(count: int) -> None:
        core = DeepgramParser()
        for _ in range(count):
            core.parse(orjson.loads(results))

    eleven = _eleven_chunks()

    def elevenlabs(count: int) -> None:
        core = ElevenAlignment()
        for i in range(count):
            if i % len(eleven) == 0:
                core.pushed(TEXT)
            core.feed(orjson.loads(eleven[i % len(eleven)]))

    cartesia_messages = _cartesia_messages()

    def cartesia(count: int) -> None:
        core = CartesiaContext("c")
        for i in range(count):
            if i % len(cartesia_messages) == 0:
                core.pushed(TEXT)
            core.on_message(orjson.loads(cartesia_messages[i % len(cartesia_messages)]))

    delta = orjson.dumps(
        {
            "type": "conversation.item.input_audio_transcription.delta",
            "event_id": "e",
            "item_id": "i",
            "content_index": 0,
            "delta": " order",
        }
    )

    def transcribe(count: int) -> None:
        core = TranscribeParser()
        for _ in range(count):
            core.parse(orjson.loads(delta))

    frame = b"\1\0" * 480

    def openai_append(count: int) -> None:
        for _ in range(count):
            append(frame)

    def eleven_send(count: int) -> None:
        for _ in range(count):
            orjson.dumps(send_text("c", "Sure, your order shipped yesterday."))

    cases = {
        "deepgram Results (final, 8 words) -> SttFinal": deepgram,
        f"elevenlabs audio 100 ms + alignment -> TtsAudio/TtsWords ({len(eleven)} chunks/clause)": elevenlabs,
        f"cartesia chunk 40 ms or timestamps -> events ({len(cartesia_messages)} msgs/clause)": cartesia,
        "openai transcription delta -> SttPartial": transcribe,
        "openai input_audio_buffer.append (20 ms, 24 kHz) built": openai_append,
        "elevenlabs SendTextMulti built": eleven_send,
    }
    print(f"{n} messages x {repeats} repeats, median CPU per message")
    for name, run in cases.items():
        print(f"  {_measure(n, repeats, run):7.2f} us  {name}")


if __name__ == "__main__":
    main()
