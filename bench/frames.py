"""``gateway bench frames``: CPU per provider message, the gateway's way against the obvious one.

The media tick writes one ``input_audio_buffer.append`` per call per 20 ms, and the provider's audio comes
back as base64 deltas. This times each piece of that per-message work two ways, interleaved and repeated,
in one process. Serializing the append into a masked client text frame:

* ``websockets``: ``ClientProtocol.send_text`` + ``data_to_send`` (what ``Connection.send`` runs: a ``Frame``,
  a ``BytesIO`` and one ``secrets.token_bytes(4)``, i.e. one ``getrandom`` system call, per frame);
* ``TextFrames``: :class:`gateway.providers._frames.TextFrames` (mask keys drawn in blocks).

Messages: 20 ms of 24 kHz PCM16 (the default) and 20 ms of G.711 (passthrough), base64 in the append
envelope. Base64: the stdlib's ``base64`` against ``pybase64`` (SIMD), encoding 20 ms of caller audio and
decoding a 100 ms delta of the provider's (strictly, as the adapters do). CPU time of the process, so other
load on a shared machine inflates neither side. The socket write itself is the same for both ways and is not
timed. See docs/adr/0009-provider-text-frames.md.

One case is per frame rather than per message: building the ``Frame`` of a tick row (20 ms of 24 kHz PCM and
the caller's 160 G.711 codes), checked by ``Frame(...)`` against :func:`telcodecs.frames.unchecked_frame`,
which the tick and the session use for arrays that meet the frame contract by construction.
"""

from __future__ import annotations

import argparse
import base64
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pybase64
from websockets.client import ClientProtocol
from websockets.protocol import State
from websockets.uri import parse_uri

from gateway.providers._frames import TextFrames
from telcodecs.frames import FRAME_SAMPLES, G711_FRAME_BYTES, Frame, unchecked_frame

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


def _b64_encode(library: bool) -> Callable[[bytes], object]:
    return base64.b64encode if library else pybase64.b64encode


def _b64_decode(library: bool) -> Callable[[str], object]:
    if library:
        return base64.b64decode
    return lambda text: pybase64.b64decode(text, validate=True)


def _frame_of_row(library: bool) -> Callable[[tuple[Any, bytes]], object]:
    if library:
        return lambda row: Frame(index=7, pcm=row[0], g711=row[1], g711_law="pcmu")
    return lambda row: unchecked_frame(7, row[0], row[1], "pcmu")


def tick_row() -> tuple[Any, bytes]:
    """Row 3 of a tick's int16[150, 480] batch and its call's codes."""
    batch = np.zeros((150, FRAME_SAMPLES), dtype=np.int16)
    batch.flags.writeable = False
    return batch[3], b"\xff" * G711_FRAME_BYTES


@dataclass(frozen=True, slots=True)
class Case:
    """One piece of per-message work, done the obvious way (``baseline``) and the gateway's way (``ours``)."""

    what: str
    baseline: str
    ours: str
    payload: Any
    build: Callable[[bool], Callable[[Any], object]]  # build(True): the baseline; build(False): ours


def cases() -> list[Case]:
    framing = [
        Case(f"frame append, {label}", "websockets", "TextFrames", append_message(size), _framer)
        for label, size in MESSAGES.items()
    ]
    pcm_20ms = bytes(range(256)) * 3 + bytes(192)
    delta_100ms = base64.b64encode(bytes(range(256)) * 37 + bytes(128)).decode("ascii")  # 9,600 bytes of PCM
    return [
        *framing,
        Case("base64 encode, 20 ms pcm", "base64", "pybase64", pcm_20ms, _b64_encode),
        Case("base64 decode, 100 ms delta", "base64", "pybase64", delta_100ms, _b64_decode),
        Case("frame of a tick row", "Frame()", "unchecked_frame", tick_row(), _frame_of_row),
    ]


def _framer(library: bool) -> Callable[[bytes], object]:
    return library_framer() if library else link_framer()


def measure(*, repeats: int, count: int) -> list[dict[str, Any]]:
    """Median µs of CPU per message for each case, both ways, interleaved ``repeats`` times."""
    rows: list[dict[str, Any]] = []
    for case in cases():
        ways = {"baseline": case.build(True), "ours": case.build(False)}
        runs: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(repeats):
            for name, work in ways.items():
                start = time.process_time()
                for _ in range(count):
                    work(case.payload)
                runs[name].append((time.process_time() - start) / count * 1e6)
        medians = {name: statistics.median(values) for name, values in runs.items()}
        rows.append(
            {
                "what": case.what,
                "bytes": len(case.payload) if isinstance(case.payload, (bytes, str)) else FRAME_SAMPLES * 2,
                "baseline": case.baseline,
                "ours": case.ours,
                "runs_us": runs,
                "median_us": medians,
                "ratio": medians["ours"] / medians["baseline"],
            }
        )
    return rows


def run(*, json_output: bool, repeats: int, count: int) -> int:
    rows = measure(repeats=repeats, count=count)
    if json_output:
        print(json.dumps({"repeats": repeats, "count": count, "results": rows}, indent=2))
        return 0
    print(f"µs of CPU per message (per frame: the frame row), median of {repeats} interleaved runs of {count} each")
    print(f"{'work':<32} {'bytes':>6} {'obvious way':>22} {'gateway':>20} {'ratio':>7}")
    for row in rows:
        median = row["median_us"]
        print(
            f"{row['what']:<32} {row['bytes']:>6} {row['baseline']:>11} {median['baseline']:>10.2f} "
            f"{row['ours']:>11} {median['ours']:>8.2f} {row['ratio']:>6.2f}x"
        )
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (median is reported)")
    parser.add_argument("--count", type=int, default=20000, help="messages per timing")


def main(args: argparse.Namespace) -> int:
    if args.repeats < 1 or args.count < 1:
        raise SystemExit("gateway bench frames: --repeats and --count must be at least 1")
    return run(json_output=args.json, repeats=args.repeats, count=args.count)
