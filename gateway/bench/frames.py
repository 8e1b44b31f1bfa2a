"""``gateway bench frames``: CPU per provider message, the link's own text framing against the library's.

The media tick writes one ``input_audio_buffer.append`` per call per 20 ms. This times serializing that
message into a masked client text frame two ways, interleaved and repeated, in one process:

* ``websockets``: ``ClientProtocol.send_text`` + ``data_to_send`` (what ``Connection.send`` runs: a ``Frame``,
  a ``BytesIO`` and one ``secrets.token_bytes(4)``, i.e. one ``getrandom`` system call, per frame);
* ``TextFrames``: :class:`gateway.providers._frames.TextFrames` (mask keys drawn in blocks).

Messages: 20 ms of 24 kHz PCM16 (the default) and 20 ms of G.711 (passthrough), base64 in the append
envelope. CPU time of the process, so other load on a shared machine inflates neither side. The socket
write itself is the same for both and is not timed. See docs/adr/0009-provider-text-frames.md.
"""

from __future__ import annotations

import base64
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from websockets.client import ClientProtocol
from websockets.protocol import State
from websockets.uri import parse_uri

from gateway.providers._frames import TextFrames

MESSAGES = {
    "pcm 24 kHz, 20 ms": 960,
    "g711, 20 ms": 160,
}


def append_message(audio_bytes: int) -> bytes:
    audio = base64.b64encode(bytes(range(256)) * (audio_bytes // 256) + bytes(audio_bytes % 256))
    return b'{"type":"input_audio_buffer.append","audio":"' + audio + b'"}'


def library_framer() -> Callable[[bytes], object]:
    protocol = ClientProtocol(parse_uri("ws://127.0.0.1/"))
    protocol.state = State.OPEN  # past the handshake, as a connection's protocol is when the tick writes

    def frame(message: bytes) -> object:
        protocol.send_text(message)
        return protocol.data_to_send()

    return frame


def link_framer() -> Callable[[bytes], object]:
    return TextFrames().frame


FRAMERS = {"websockets": library_framer, "TextFrames": link_framer}


def measure(*, repeats: int, count: int) -> list[dict[str, Any]]:
    """Median µs of CPU per message for each framer and message, interleaved ``repeats`` times."""
    rows: list[dict[str, Any]] = []
    for label, audio_bytes in MESSAGES.items():
        message = append_message(audio_bytes)
        framers = {name: build() for name, build in FRAMERS.items()}
        runs: dict[str, list[float]] = {name: [] for name in framers}
        for _ in range(repeats):
            for name, frame in framers.items():
                start = time.process_time()
                for _ in range(count):
                    frame(message)
                runs[name].append((time.process_time() - start) / count * 1e6)
        medians = {name: statistics.median(values) for name, values in runs.items()}
        rows.append(
            {
                "message": label,
                "bytes": len(message),
                "runs_us": runs,
                "median_us": medians,
                "ratio": medians["TextFrames"] / medians["websockets"],
            }
        )
    return rows


def run(*, json_output: bool, repeats: int, count: int) -> int:
    rows = measure(repeats=repeats, count=count)
    if json_output:
        print(json.dumps({"repeats": repeats, "count": count, "results": rows}, indent=2))
        return 0
    print(f"µs of CPU per message, median of {repeats} interleaved runs of {count} messages")
    print(f"{'message':<20} {'bytes':>6} {'websockets':>11} {'TextFrames':>11} {'ratio':>7}")
    for row in rows:
        median = row["median_us"]
        print(
            f"{row['message']:<20} {row['bytes']:>6} {median['websockets']:>11.2f} "
            f"{median['TextFrames']:>11.2f} {row['ratio']:>6.2f}x"
        )
    return 0
