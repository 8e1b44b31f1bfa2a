"""``gateway bench codecs``: DSP cost per call per 20 ms frame, batched telcodecs against the alternatives.

Two round trips are measured, each as one media tick for N calls (receive direction + send direction):

* G.711 <-> 24 kHz: PCMU payload -> decode -> 8k->24k | 24 kHz frame -> 24k->8k -> encode -> payload;
* Opus <-> 24 kHz: packet -> decode (48 kHz) -> 48k->24k | 24 kHz frame -> 24k->48k -> encode -> packet; and
  what the media tick does, libopus decoding to and encoding from 24 kHz itself (no resampler).
* G.722 <-> 24 kHz: payload -> decode per call (16 kHz) -> 16k->24k batched | 24 kHz frame -> 24k->16k batched ->
  encode per call -> payload; and each G.722 implementation's encode and decode alone (bench/_g722.py).

Beside them, the Opus encode alone: a frame of speech, a frame of an agent's silence through libopus, and the
same silence once the encoder has settled and reuses its packet (``OpusEncoder(reuse_silence=...)``). And the
Opus decode around a lost packet, per pair of frames: two packets received, one lost and concealed
(``OpusDecoder.conceal``) before the next, and one lost and bridged from the next (``decode_fec``).

Paths: telcodecs batched (BatchResampler + batch LUTs, N = 1, 10, 100, 1000), telcodecs per call
(StreamResampler per call), and what a user would otherwise pick: aiortc's codec classes (PyAV codecs and
resampling), libopus through PyAV's codec contexts (the batched path with only the binding changed),
``av.AudioResampler``, ``soxr.ResampleStream``, and stdlib ``audioop`` where it exists.
Every case is timed several times, interleaved with the others (so load drift hits all alike), and the
median is reported. Results and the machine facts go to docs/performance.md.

The unit is one core: BLAS is held to one thread (unless OPENBLAS_NUM_THREADS says otherwise), because a
deployment sizes calls per core and runs one media worker per core.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

# Before numpy loads its BLAS (when run from the CLI, nothing has imported numpy yet).
_NUMPY_WAS_LOADED = "numpy" in sys.modules
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import numpy.typing as npt  # noqa: E402

from bench import _g722  # noqa: E402
from telcodecs import g711  # noqa: E402
from telcodecs.g722 import library_version as libg722_version  # noqa: E402
from telcodecs.opus import SILENCE_SETTLE_FRAMES, OpusDecoder, OpusEncoder, libopus_version  # noqa: E402
from telcodecs.resample import BatchResampler, StreamResampler  # noqa: E402

Tick = Callable[[], None]

BATCH_SIZES = (1, 10, 100, 1000)
G711_TARGET_US = 6.0
G711_TARGET_RATIO = 10.0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    name: str
    family: str  # "g711", "g722", "g722-codec", "opus", "opus-encode" or "opus-loss"
    # "batched", "libopus-24k", "per-call", "aiortc", "pyav-codec", "av", "soxr", "audioop"; g722-codec: the library
    path: str
    calls: int
    frames: int  # ticks per timing
    build: Callable[[], Tick]


# --- signals -----------------------------------------------------------------------------------------------


def _speech_like(rate: int, seconds: float) -> npt.NDArray[np.int16]:
    t = np.arange(int(rate * seconds)) / rate
    phase = 2 * np.pi * np.cumsum(140 * (1 + 0.1 * np.sin(2 * np.pi * 3 * t))) / rate
    harmonics = sum(np.sin(k * phase) / k for k in range(1, 20))
    x = harmonics * (0.3 + 0.7 * np.sin(2 * np.pi * 2 * t) ** 2)
    pcm: npt.NDArray[np.int16] = np.rint(x / np.abs(x).max() * 10000).astype(np.int16)
    return pcm


def _frames(signal: npt.NDArray[np.int16], size: int, count: int) -> npt.NDArray[np.int16]:
    return signal[: size * count].reshape(count, size)


# --- telcodecs paths ---------------------------------------------------------------------------------------


def _g711_batched(calls: int) -> Tick:
    up, down = BatchResampler(8000, 24000, capacity=calls), BatchResampler(24000, 8000, capacity=calls)
    rows = np.array([up.open() for _ in range(calls)], dtype=np.intp)
    for _ in range(calls):
        down.open()
    codes = np.tile(g711.ulaw_encode_batch(_frames(_speech_like(8000, 0.02), 160, 1)), (calls, 1))
    outbound = np.tile(_frames(_speech_like(24000, 0.02), 480, 1), (calls, 1))

    def tick() -> None:
        up.process(rows, g711.ulaw_decode_batch(codes))  # -> sessions
        g711.ulaw_encode_batch(down.process(rows, outbound))  # -> RTP payloads

    return tick


def _g711_per_call(calls: int) -> Tick:
    ups = [StreamResampler(8000, 24000) for _ in range(calls)]
    downs = [StreamResampler(24000, 8000) for _ in range(calls)]
    payload = g711.ulaw_encode(_speech_like(8000, 0.02))
    outbound = _speech_like(24000, 0.02)

    def tick() -> None:
        for up, down in zip(ups, downs):
            up.process(g711.ulaw_decode(payload))
            g711.ulaw_encode(down.process(outbound))

    return tick


def _opus_batched(calls: int) -> Tick:
    down, up = BatchResampler(48000, 24000, capacity=calls), BatchResampler(24000, 48000, capacity=calls)
    rows = np.array([down.open() for _ in range(calls)], dtype=np.intp)
    for _ in range(calls):
        up.open()
    decoders = [OpusDecoder() for _ in range(calls)]
    encoders = [OpusEncoder() for _ in range(calls)]
    next_packet = _packet_cycle()
    outbound = np.tile(_frames(_speech_like(24000, 0.02), 480, 1), (calls, 1))

    def tick() -> None:
        packet = next_packet()
        decoded = np.stack([decoder.decode(packet) for decoder in decoders])
        down.process(rows, decoded)
        for encoder, pcm in zip(encoders, up.process(rows, outbound)):
            encoder.encode(pcm)

    return tick


def _opus_at_24k(calls: int) -> Tick:
    """What the media tick does: libopus decodes to and encodes from 24 kHz itself, no resampler either way."""
    decoders = [OpusDecoder(sample_rate=24000) for _ in range(calls)]
    encoders = [OpusEncoder(sample_rate=24000) for _ in range(calls)]
    next_packet = _packet_cycle()
    outbound = _speech_like(24000, 0.02)

    def tick() -> None:
        packet = next_packet()
        decoded = np.empty((calls, 480), dtype=np.int16)
        for i, decoder in enumerate(decoders):
            decoded[i] = decoder.decode(packet)
        for encoder in encoders:
            encoder.encode(outbound)

    return tick


def _opus_per_call(calls: int) -> Tick:
    downs = [StreamResampler(48000, 24000) for _ in range(calls)]
    ups = [StreamResampler(24000, 48000) for _ in range(calls)]
    decoders = [OpusDecoder() for _ in range(calls)]
    encoders = [OpusEncoder() for _ in range(calls)]
    next_packet = _packet_cycle()
    outbound = _speech_like(24000, 0.02)

    def tick() -> None:
        packet = next_packet()
        for decoder, encoder, down, up in zip(decoders, encoders, downs, ups):
            down.process(decoder.decode(packet))
            encoder.encode(up.process(outbound))

    return tick


def _opus_encode(calls: int, *, silence: bool, reuse: bool) -> Tick:
    """One 48 kHz frame encoded per call per tick: speech, or an agent's silence (exact zeros) with or without
    the settled packet reused."""
    encoders = [OpusEncoder(reuse_silence=reuse) for _ in range(calls)]
    speech = _frames(_speech_like(48000, 0.5), 960, 25)
    quiet = np.zeros(960, dtype=np.int16)
    if silence:  # steady state: a silence long under way
        for encoder in encoders:
            for _ in range(SILENCE_SETTLE_FRAMES + 1):
                encoder.encode(quiet)
    position = [0]

    def tick() -> None:
        pcm = quiet if silence else speech[position[0] % len(speech)]
        position[0] += 1
        for encoder in encoders:
            encoder.encode(pcm)

    return tick


def _opus_loss(calls: int, *, lost: str) -> Tick:
    """Two 20 ms frames per call per tick, decoded at 48 kHz: both received (``lost="none"``), or the first lost
    and concealed (``"conceal"``) or bridged from the second (``"bridge"``), the second then decoded."""
    decoders = [OpusDecoder() for _ in range(calls)]
    packets = _opus_packets()
    for decoder in decoders:  # a speech history to conceal from
        for packet in packets[:3]:
            decoder.decode(packet)
    position = [3]

    def tick() -> None:
        first = packets[position[0] % len(packets)]
        second = packets[(position[0] + 1) % len(packets)]
        position[0] += 2
        for decoder in decoders:
            if lost == "conceal":
                decoder.conceal()
            elif lost == "bridge":
                decoder.decode_fec(second)
            else:
                decoder.decode(first)
            decoder.decode(second)

    return tick


def _packet_cycle() -> Callable[[], bytes]:
    """The speech packets of :func:`_opus_packets`, one per call, round and round."""
    packets = _opus_packets()
    position = itertools.count()
    return lambda: packets[next(position) % len(packets)]


def _opus_packets() -> list[bytes]:
    encoder = OpusEncoder()
    return [encoder.encode(f) for f in _frames(_speech_like(48000, 0.5), 960, 25)]


# --- alternatives ------------------------------------------------------------------------------------------


def _audio_frame(pcm: npt.NDArray[np.int16], rate: int, pts: int) -> Any:
    import av

    frame = av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = rate
    frame.pts = pts
    return frame


def _g711_aiortc(calls: int) -> Tick:
    import av
    from aiortc.codecs.g711 import PcmuDecoder, PcmuEncoder
    from aiortc.jitterbuffer import JitterFrame

    decoders = [PcmuDecoder() for _ in range(calls)]
    encoders = [PcmuEncoder() for _ in range(calls)]
    upsamplers = [av.AudioResampler(format="s16", layout="mono", rate=24000) for _ in range(calls)]
    payload = g711.ulaw_encode(_speech_like(8000, 0.02))
    outbound = _speech_like(24000, 0.02)
    clock = [0]

    def tick() -> None:
        ts = clock[0]
        clock[0] += 1
        for decoder, encoder, upsampler in zip(decoders, encoders, upsamplers):
            for frame in decoder.decode(JitterFrame(payload, ts * 160)):
                for out in upsampler.resample(frame):
                    out.to_ndarray()
            encoder.encode(_audio_frame(outbound, 24000, ts * 480))

    return tick


def _g711_av(calls: int) -> Tick:
    import av

    ups = [av.AudioResampler(format="s16", layout="mono", rate=24000) for _ in range(calls)]
    downs = [av.AudioResampler(format="s16", layout="mono", rate=8000) for _ in range(calls)]
    payload = g711.ulaw_encode(_speech_like(8000, 0.02))
    outbound = _speech_like(24000, 0.02)
    clock = [0]

    def tick() -> None:
        ts = clock[0]
        clock[0] += 1
        for up, down in zip(ups, downs):
            for out in up.resample(_audio_frame(g711.ulaw_decode(payload), 8000, ts * 160)):
                out.to_ndarray()
            for out in down.resample(_audio_frame(outbound, 24000, ts * 480)):
                g711.ulaw_encode(out.to_ndarray().reshape(-1))

    return tick


def _g711_soxr(calls: int) -> Tick:
    import soxr

    ups = [soxr.ResampleStream(8000, 24000, 1, dtype="int16") for _ in range(calls)]
    downs = [soxr.ResampleStream(24000, 8000, 1, dtype="int16") for _ in range(calls)]
    payload = g711.ulaw_encode(_speech_like(8000, 0.02))
    outbound = _speech_like(24000, 0.02)

    def tick() -> None:
        for up, down in zip(ups, downs):
            up.resample_chunk(g711.ulaw_decode(payload))
            g711.ulaw_encode(np.ascontiguousarray(down.resample_chunk(outbound)))

    return tick


def _g711_audioop(calls: int) -> Tick:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import audioop

    payload = g711.ulaw_encode(_speech_like(8000, 0.02))
    outbound = _speech_like(24000, 0.02).tobytes()
    states: list[list[Any]] = [[None, None] for _ in range(calls)]

    def tick() -> None:
        for state in states:
            _to_session, state[0] = audioop.ratecv(audioop.ulaw2lin(payload, 2), 2, 1, 8000, 24000, state[0])
            down, state[1] = audioop.ratecv(outbound, 2, 1, 24000, 8000, state[1])
            audioop.lin2ulaw(down, 2)

    return tick


def _opus_aiortc(calls: int) -> Tick:
    import av
    from aiortc.codecs.opus import OpusDecoder as AiortcOpusDecoder
    from aiortc.codecs.opus import OpusEncoder as AiortcOpusEncoder
    from aiortc.jitterbuffer import JitterFrame

    decoders = [AiortcOpusDecoder() for _ in range(calls)]
    encoders = [AiortcOpusEncoder() for _ in range(calls)]
    downs = [av.AudioResampler(format="s16", layout="mono", rate=24000) for _ in range(calls)]
    packets = _opus_packets()
    outbound = _speech_like(24000, 0.02)
    clock = [0]

    def tick() -> None:
        ts = clock[0]
        clock[0] += 1
        packet = packets[ts % len(packets)]
        for decoder, encoder, down in zip(decoders, encoders, downs):
            for frame in decoder.decode(JitterFrame(packet, ts * 960)):
                for out in down.resample(frame):
                    out.to_ndarray()
            encoder.encode(_audio_frame(outbound, 24000, ts * 480))

    return tick


def _opus_pyav_contexts(calls: int) -> Tick:
    """The batched path with libopus reached through PyAV's codec contexts (FFmpeg's libopus wrapper), as
    telcodecs.opus did before it called libopus itself (ADR 0012): only the binding differs."""
    import av

    down, up = BatchResampler(48000, 24000, capacity=calls), BatchResampler(24000, 48000, capacity=calls)
    rows = np.array([down.open() for _ in range(calls)], dtype=np.intp)
    for _ in range(calls):
        up.open()
    decoders, encoders = [], []
    for _ in range(calls):
        decoder = av.CodecContext.create("libopus", "r")
        decoder.sample_rate, decoder.layout, decoder.format = 48000, "mono", "s16"
        decoders.append(decoder)
        encoder = av.CodecContext.create("libopus", "w")
        encoder.sample_rate, encoder.layout, encoder.format, encoder.bit_rate = 48000, "mono", "s16", 32000
        encoder.options = {
            "application": "voip",
            "frame_duration": "20",
            "fec": "1",
            "packet_loss": "10",
            "compression_level": "5",
        }
        encoder.open()
        encoders.append(encoder)
    packets = _opus_packets()
    outbound = np.tile(_frames(_speech_like(24000, 0.02), 480, 1), (calls, 1))
    clock = [0]

    def tick() -> None:
        ts = clock[0]
        clock[0] += 1
        packet = packets[ts % len(packets)]
        decoded = np.stack([decoder.decode(av.Packet(packet))[0].to_ndarray().reshape(-1) for decoder in decoders])
        down.process(rows, decoded)
        for encoder, pcm in zip(encoders, up.process(rows, outbound)):
            for out in encoder.encode(_audio_frame(np.ascontiguousarray(pcm), 48000, ts * 960)):
                bytes(out)

    return tick


def _opus_av(calls: int) -> Tick:
    import av

    downs = [av.AudioResampler(format="s16", layout="mono", rate=24000) for _ in range(calls)]
    ups = [av.AudioResampler(format="s16", layout="mono", rate=48000) for _ in range(calls)]
    decoders = [OpusDecoder() for _ in range(calls)]
    encoders = [OpusEncoder() for _ in range(calls)]
    packets = _opus_packets()
    outbound = _speech_like(24000, 0.02)
    clock = [0]
    pending = [np.zeros(0, dtype=np.int16) for _ in range(calls)]

    def tick() -> None:
        ts = clock[0]
        clock[0] += 1
        packet = packets[ts % len(packets)]
        for i, (decoder, encoder, down, up) in enumerate(zip(decoders, encoders, downs, ups)):
            for out in down.resample(_audio_frame(decoder.decode(packet), 48000, ts * 960)):
                out.to_ndarray()
            # av.AudioResampler buffers: encode whole 20 ms frames as they become available.
            for out in up.resample(_audio_frame(outbound, 24000, ts * 480)):
                pending[i] = np.concatenate([pending[i], out.to_ndarray().reshape(-1)])
            while pending[i].shape[0] >= 960:
                encoder.encode(np.ascontiguousarray(pending[i][:960]))
                pending[i] = pending[i][960:]

    return tick


# --- running -----------------------------------------------------------------------------------------------


def _cases(quick: bool) -> list[Case]:
    def frames_for(calls: int) -> int:
        if quick:
            return 2
        return max(3, min(100, 2000 // calls))

    alt_calls = 3 if quick else 20
    per_call = 10 if quick else 100
    cases: list[Case] = []
    for n in BATCH_SIZES:
        cases.append(
            Case(
                name="g711<->24k telcodecs batched",
                family="g711",
                path="batched",
                calls=n,
                frames=frames_for(n),
                build=lambda n=n: _g711_batched(n),
            )
        )
    cases.append(
        Case(
            name="g711<->24k telcodecs per-call StreamResampler",
            family="g711",
            path="per-call",
            calls=per_call,
            frames=frames_for(per_call),
            build=lambda: _g711_per_call(per_call),
        )
    )
    alternatives: list[tuple[str, str, Callable[[int], Tick]]] = [
        ("g711<->24k aiortc PcmuDecoder/PcmuEncoder + av.AudioResampler", "aiortc", _g711_aiortc),
        ("g711<->24k av.AudioResampler + telcodecs.g711", "av", _g711_av),
        ("g711<->24k soxr.ResampleStream + telcodecs.g711", "soxr", _g711_soxr),
    ]
    if sys.version_info < (3, 13):
        alternatives.append(("g711<->24k audioop ulaw2lin/ratecv/lin2ulaw", "audioop", _g711_audioop))
    for name, path, build in alternatives:
        cases.append(
            Case(
                name=name,
                family="g711",
                path=path,
                calls=alt_calls,
                frames=frames_for(alt_calls),
                build=lambda build=build: build(alt_calls),
            )
        )
    for n in BATCH_SIZES if not quick else (1, 10):
        cases.append(
            Case(
                name="g722<->24k telcodecs, libg722 per call, batched resample",
                family="g722",
                path="batched",
                calls=n,
                frames=frames_for(n),
                build=lambda n=n: _g722.batched(n, _speech_like),
            )
        )
    cases.append(
        Case(
            name="g722<->24k telcodecs, libg722 per call, per-call StreamResampler",
            family="g722",
            path="per-call",
            calls=per_call,
            frames=frames_for(per_call),
            build=lambda: _g722.per_call(per_call, _speech_like),
        )
    )
    for implementation in _g722.implementations():
        for direction in ("encode", "decode"):
            cases.append(
                Case(
                    name=f"g722 {direction}, {implementation}",
                    family="g722-codec",
                    path=implementation,
                    calls=alt_calls,
                    frames=frames_for(alt_calls),
                    build=lambda i=implementation, d=direction: _g722.codec(
                        alt_calls, _speech_like, implementation=i, direction=d
                    ),
                )
            )
    for n in BATCH_SIZES if not quick else (1, 10):
        cases.append(
            Case(
                name="opus<->24k telcodecs batched resample",
                family="opus",
                path="batched",
                calls=n,
                frames=max(2, frames_for(n) // 4),
                build=lambda n=n: _opus_batched(n),
            )
        )
    cases.append(
        Case(
            name="opus<->24k telcodecs, libopus at 24 kHz (no resampler)",
            family="opus",
            path="libopus-24k",
            calls=per_call,
            frames=max(2, frames_for(per_call) // 4),
            build=lambda: _opus_at_24k(per_call),
        )
    )
    cases.append(
        Case(
            name="opus<->24k telcodecs per-call StreamResampler",
            family="opus",
            path="per-call",
            calls=alt_calls,
            frames=frames_for(alt_calls),
            build=lambda: _opus_per_call(alt_calls),
        )
    )
    cases.append(
        Case(
            name="opus<->24k aiortc OpusDecoder/OpusEncoder + av.AudioResampler",
            family="opus",
            path="aiortc",
            calls=alt_calls,
            frames=frames_for(alt_calls),
            build=lambda: _opus_aiortc(alt_calls),
        )
    )
    cases.append(
        Case(
            name="opus<->24k libopus through PyAV codec contexts + batched resample",
            family="opus",
            path="pyav-codec",
            calls=per_call,  # as many calls as a batched row, so the two differ in the binding only
            frames=max(2, frames_for(per_call) // 4),
            build=lambda: _opus_pyav_contexts(per_call),
        )
    )
    cases.append(
        Case(
            name="opus<->24k telcodecs.opus + av.AudioResampler",
            family="opus",
            path="av",
            calls=alt_calls,
            frames=frames_for(alt_calls),
            build=lambda: _opus_av(alt_calls),
        )
    )
    for name, silence, reuse in (
        ("opus encode, speech", False, True),
        ("opus encode, silence, every frame through libopus", True, False),
        ("opus encode, silence, settled packet reused", True, True),
    ):
        cases.append(
            Case(
                name=name,
                family="opus-encode",
                path="reused" if silence and reuse else "libopus",
                calls=alt_calls,
                frames=frames_for(alt_calls),
                build=lambda silence=silence, reuse=reuse: _opus_encode(alt_calls, silence=silence, reuse=reuse),
            )
        )
    for name, lost in (
        ("opus decode, two packets received", "none"),
        ("opus decode, one lost and concealed, the next received", "conceal"),
        ("opus decode, one lost and bridged from the next", "bridge"),
    ):
        cases.append(
            Case(
                name=name,
                family="opus-loss",
                path="received" if lost == "none" else lost,
                calls=alt_calls,
                frames=frames_for(alt_calls),
                build=lambda lost=lost: _opus_loss(alt_calls, lost=lost),
            )
        )
    return cases


def _time_tick(tick: Tick, frames: int, calls: int) -> tuple[float, float]:
    """(wall, CPU) µs per call-frame. CPU time leaves out the time the OS ran other processes instead."""
    start, start_cpu = time.perf_counter(), time.process_time()
    for _ in range(frames):
        tick()
    wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
    scale = 1e6 / (frames * calls)
    return wall * scale, cpu * scale


def _environment() -> dict[str, Any]:
    import av
    import scipy

    blas: dict[str, Any] = {}
    try:
        config: Any = np.show_config(mode="dicts")
        blas_info = config["Build Dependencies"]["blas"]
        blas = {"name": blas_info.get("name"), "version": blas_info.get("version")}
    except (TypeError, KeyError):
        pass
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    versions: dict[str, str] = {
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "av": av.__version__,
        "libopus": libopus_version(),
        "libg722": libg722_version(),
    }
    for module in ("aiortc", "soxr"):
        try:
            versions[module] = __import__(module).__version__
        except ImportError:
            versions[module] = "absent"
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        "blas": blas,
        "blas_threads_env": {k: os.environ[k] for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS") if k in os.environ},
        "blas_threads_env_applied": not _NUMPY_WAS_LOADED,
        "versions": versions,
    }


def measure(*, repeats: int, quick: bool) -> dict[str, Any]:
    """Run every case ``repeats`` times, interleaved; returns the JSON-ready report."""
    env = _environment()
    cases = _cases(quick)
    ticks = []
    for case in cases:
        tick = case.build()
        tick()  # warm up: first-call allocations, codec start-up
        ticks.append(tick)
    samples: list[list[tuple[float, float]]] = [[] for _ in cases]
    started = time.perf_counter()
    for _ in range(max(1, repeats)):
        for i, case in enumerate(cases):
            samples[i].append(_time_tick(ticks[i], case.frames, case.calls))
    results = [
        {
            "name": case.name,
            "family": case.family,
            "path": case.path,
            "calls": case.calls,
            "us_per_call_frame": round(statistics.median(wall for wall, _ in values), 3),
            "min_us_per_call_frame": round(min(wall for wall, _ in values), 3),
            "cpu_us_per_call_frame": round(statistics.median(cpu for _, cpu in values), 3),
            "repeats": len(values),
            "frames_per_repeat": case.frames,
        }
        for case, values in zip(cases, samples)
    ]
    env["seconds_measuring"] = round(time.perf_counter() - started, 1)
    return {"results": results, "env": env, "targets": _targets(results)}


def _targets(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The issue's two G.711 targets, judged on wall-clock medians and, separately, on CPU-time medians."""

    def judge(key: str) -> dict[str, Any]:
        batched = [
            float(r[key]) for r in results if r["family"] == "g711" and r["path"] == "batched" and r["calls"] >= 100
        ]
        aiortc = [float(r[key]) for r in results if r["family"] == "g711" and r["path"] == "aiortc"]
        worst = max(batched) if batched else None
        ratio = round(aiortc[0] / worst, 1) if aiortc and worst else None
        return {
            "g711_batched_worst_us_at_n_ge_100": worst,
            "g711_batched_meets_target": worst is not None and worst <= G711_TARGET_US,
            "g711_aiortc_over_batched_ratio": ratio,
            "g711_meets_ratio_target": ratio is not None and ratio >= G711_TARGET_RATIO,
        }

    return {
        "g711_batched_target_us": G711_TARGET_US,
        "g711_ratio_target": G711_TARGET_RATIO,
        "wall": judge("us_per_call_frame"),
        "cpu": judge("cpu_us_per_call_frame"),
    }


def _print_table(report: dict[str, Any]) -> None:
    env = report["env"]
    print(f"gateway bench codecs  ({env['cpu']}, {env['cpu_count']} CPUs, Python {env['python']})")
    print(f"load average at start {env['loadavg_at_start']}; medians of {report['results'][0]['repeats']} runs\n")
    print(f"{'path':66} {'calls':>6} {'µs/call-frame':>14} {'min':>9} {'CPU µs':>9}")
    for r in report["results"]:
        print(
            f"{r['name']:66} {r['calls']:>6} {r['us_per_call_frame']:>14.2f} "
            f"{r['min_us_per_call_frame']:>9.2f} {r['cpu_us_per_call_frame']:>9.2f}"
        )
    t = report["targets"]
    print()
    for clock in ("wall", "cpu"):
        j = t[clock]
        print(
            f"[{clock:4}] G.711 batched, worst at N >= 100: {j['g711_batched_worst_us_at_n_ge_100']} µs "
            f"(target <= {t['g711_batched_target_us']}: {'met' if j['g711_batched_meets_target'] else 'MISSED'}); "
            f"aiortc classes / batched: {j['g711_aiortc_over_batched_ratio']}x "
            f"(target >= {t['g711_ratio_target']}x: {'met' if j['g711_meets_ratio_target'] else 'MISSED'})"
        )


def run(json_output: bool, repeats: int, quick: bool) -> int:
    report = measure(repeats=repeats, quick=quick)
    if json_output:
        print(json.dumps(report))
    else:
        _print_table(report)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repetitions (median is reported)")
    parser.add_argument("--quick", action="store_true", help="fewer frames per measurement (for tests)")


def main(args: argparse.Namespace) -> int:
    return run(json_output=args.json, repeats=args.repeats, quick=args.quick)
