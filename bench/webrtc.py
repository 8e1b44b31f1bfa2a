"""``gateway bench webrtc``: what a browser call costs the worker, beside a G.711 SIP call on the same worker.

Each run starts ``gateway run`` (echo agent; control plane, worker and the WebRTC endpoint in one process,
pinned to one core) and measures that process's CPU over a window while it carries:

- ``--calls`` browser calls: aiortc peers in this process (on the other core) that post their offer to
  ``/v1/webrtc/offer``, play speech, and record what they hear; once per media path asked for, interleaved:
  the agent's Opus encoded by the gateway's track or by aiortc's sender (``--encoder``,
  ``GATEWAY_WEBRTC_ENCODER``), the caller's decoded on the loop or by aiortc's decoder thread (``--decoder``,
  ``GATEWAY_WEBRTC_DECODER``);
- ``--g711-calls`` PCMU calls from ``gateway loadtest`` (its own process, on the other core), the unit the
  worker's capacity is counted in.

The figure is CPU per call per 20 ms (µs per call-frame) above the idle process, the median of ``--repeats``
runs, and each browser call's audio is checked: the speech it sent must come back (block-wise correlation
that tolerates jitter-buffer slips). ``GATEWAY_WEBRTC_CALL_COST`` is the ratio of the two figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import numpy.typing as npt
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from bench import arguments
from bench.processes import BenchProcess, cpus_named, free_port, pin
from gateway.loadtest.analysis import blockwise_match, echo_correlation
from gateway.loadtest.audio import source_audio
from gateway.transport.webrtc_receive import downmix_s16

RATE = 48_000
_TOKEN = "bench-webrtc-token-0123456789"
_AUDIO_OK = 0.6  # block-wise score of the echoed speech (Opus both ways; the same speech scores 0.8-0.95)


@dataclass(frozen=True, slots=True, kw_only=True)
class WebRtcBenchConfig:
    calls: int = 8
    g711_calls: int = 100
    window_s: float = 10.0
    repeats: int = 3
    encoders: tuple[str, ...] = ("gateway",)
    decoders: tuple[str, ...] = ("gateway", "aiortc")
    worker_core: int | None = 0
    load_core: tuple[int, ...] | None = (1,)  # the browsers' and the loadtest's CPUs (None: any)

    def __post_init__(self) -> None:
        if self.calls < 1 or self.g711_calls < 0 or self.repeats < 1 or self.window_s < 2:
            raise ValueError("need calls >= 1, g711_calls >= 0, repeats >= 1 and a window of 2 s or more")
        for name, values in (("encoders", self.encoders), ("decoders", self.decoders)):
            if not values or set(values) - {"gateway", "aiortc"}:
                raise ValueError(f"{name}: gateway and/or aiortc")

    @property
    def paths(self) -> list[tuple[str, str]]:
        """(encoder, decoder) of each browser run, the gateway's own first."""
        return [(encoder, decoder) for encoder in self.encoders for decoder in self.decoders]


class PlaybackTrack(MediaStreamTrack):
    """A microphone that plays ``samples`` (mono 48 kHz) in 20 ms frames at absolute deadlines, then silence."""

    kind = "audio"

    def __init__(self, samples: npt.NDArray[np.int16]) -> None:
        super().__init__()
        self.samples = samples
        self._k = 0
        self._t0: float | None = None

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self._t0 is None:
            self._t0 = loop.time()
        delay = self._t0 + self._k * 0.02 - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        piece = self.samples[self._k * 960 : (self._k + 1) * 960]
        if piece.size < 960:
            piece = np.concatenate((piece, np.zeros(960 - piece.size, dtype=np.int16)))
        frame = av.AudioFrame.from_ndarray(piece.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self._k * 960
        frame.time_base = Fraction(1, RATE)
        self._k += 1
        return frame


def _speech(seconds: float, index: int) -> npt.NDArray[np.int16]:
    """What browser ``index`` says: the load tester's speech (espeak-ng's when installed), looped, each call
    starting 1.3 s further into it, so one call hearing another's audio would not pass for its echo."""
    speech = source_audio("speech", RATE)
    needed = int(seconds * RATE)
    looped = np.tile(speech, needed // speech.size + 2)
    start = int(index * 1.3 * RATE) % speech.size
    return np.ascontiguousarray(looped[start : start + needed])


@dataclass(slots=True)
class _Browser:
    """One browser caller: an aiortc peer that speaks ``sent`` and keeps what it hears (mono 48 kHz)."""

    sent: npt.NDArray[np.int16]
    pc: RTCPeerConnection = field(default_factory=lambda: RTCPeerConnection(RTCConfiguration(iceServers=[])))
    heard: list[npt.NDArray[np.int16]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None
    lag: int = 0  # samples from the speech sent to where it was heard back (set by match())

    async def call(self, client: httpx.AsyncClient) -> None:
        self.pc.addTrack(PlaybackTrack(self.sent))
        self.pc.createDataChannel("control")
        self.pc.on("track", self._on_track)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        response = await client.post(
            "/v1/webrtc/offer",
            json={"sdp": self.pc.localDescription.sdp, "type": "offer"},
            headers={"Authorization": f"Bearer {_TOKEN}"},
        )
        if response.status_code != 200:
            raise RuntimeError(f"offer refused: {response.status_code} {response.text[:300]}")
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=response.json()["sdp"], type="answer"))

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and self.reader is None:
            self.reader = asyncio.get_running_loop().create_task(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.AudioFrame)
                self.heard.append(downmix_s16(frame))

    def heard_seconds(self) -> float:
        return sum(piece.size for piece in self.heard) / RATE

    def match(self) -> float:
        """How well the speech sent came back (median block score, 0..1)."""
        heard = np.concatenate(self.heard) if self.heard else np.zeros(0, np.int16)
        span = min(self.sent.size, heard.size) - RATE  # what could have come back by now
        if span < 2 * RATE:
            return 0.0
        found = echo_correlation(self.sent[: 3 * RATE], heard, max_lag=RATE)
        self.lag = found.lag
        block = RATE // 10
        return blockwise_match(
            self.sent, heard, start=0, end=span - RATE // 2, lag=found.lag, block=block, search=block
        ).score

    async def close(self) -> None:
        await asyncio.wait_for(self.pc.close(), timeout=5)
        if self.reader is not None:
            self.reader.cancel()
            await asyncio.gather(self.reader, return_exceptions=True)


class _Gateway:
    """``gateway run`` with the echo agent, its HTTP and SIP ports free ones, pinned to the worker core."""

    def __init__(self, config: WebRtcBenchConfig, directory: Path, encoder: str, decoder: str) -> None:
        self.http_port, self.sip_port = free_port(), free_port()
        env = {
            **os.environ,
            "GATEWAY_SIP_PORT": str(self.sip_port),
            "GATEWAY_HTTP_PORT": str(self.http_port),
            "GATEWAY_RTP_PORTS": "41000-41999",
            "GATEWAY_API_TOKEN": _TOKEN,
            "GATEWAY_PROVIDER": "echo",
            "GATEWAY_CAPACITY": "100000",
            "GATEWAY_WEBRTC_MAX_CALLS": str(config.calls),
            "GATEWAY_WEBRTC_ENCODER": encoder,
            "GATEWAY_WEBRTC_DECODER": decoder,
            "GATEWAY_SIP_RATE_LIMIT_PER_S": "1000",
            "PYTHONUNBUFFERED": "1",
        }
        self.proc = BenchProcess(
            f"gateway-{encoder}-{decoder}", [sys.executable, "-m", "gateway", "run"], directory, env=env
        )
        self.pinned = pin(self.proc.popen.pid, config.worker_core)
        self.proc.wait_for(r"gateway: SIP", within=60)

    async def cpu_per_s(self, window_s: float) -> float:
        loop = asyncio.get_running_loop()
        c0, t0 = self.proc.cpu_s(), loop.time()
        await asyncio.sleep(window_s)
        return (self.proc.cpu_s() - c0) / (loop.time() - t0)

    def stop(self) -> None:
        self.proc.stop()


async def _ready(client: httpx.AsyncClient, within: float, gateway: _Gateway) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if (await client.get("/healthz")).status_code == 200:
                return
        if (ended := gateway.proc.exit_report()) is not None:
            raise RuntimeError(f"gateway run ended before it answered /healthz: {ended}")
        await asyncio.sleep(0.1)
    raise TimeoutError(
        f"gateway run did not answer /healthz on port {gateway.http_port} within {within:g} s; its log ends:\n"
        + gateway.proc.log_tail()
    )


async def _browser_run(config: WebRtcBenchConfig, gateway: _Gateway) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{gateway.http_port}", timeout=30) as client:
        await _ready(client, 30, gateway)
        idle = await gateway.cpu_per_s(3.0)
        browsers = [_Browser(sent=_speech(config.window_s + 15, index)) for index in range(config.calls)]
        try:
            for browser in browsers:
                await browser.call(client)
            deadline = time.monotonic() + 20
            while min(b.heard_seconds() for b in browsers) < 2.0:
                if time.monotonic() > deadline:
                    raise TimeoutError("a browser call heard nothing back within 20 s")
                await asyncio.sleep(0.1)
            busy = await gateway.cpu_per_s(config.window_s)
            scores = [browser.match() for browser in browsers]
        finally:
            for browser in browsers:
                with contextlib.suppress(Exception):
                    await browser.close()
    return {
        "calls": config.calls,
        "core_pct": 100 * busy,
        "idle_pct": 100 * idle,
        "us_per_call_frame": (busy - idle) / (config.calls * 50) * 1e6,
        "audio_right": sum(score >= _AUDIO_OK for score in scores),
        "min_score": min(scores),
        # each browser's own playback start to its hearing the echo: both peers' buffering and the gateway's
        "echo_ms": statistics.median(browser.lag for browser in browsers) / RATE * 1000,
    }


async def _g711_run(config: WebRtcBenchConfig, gateway: _Gateway, directory: Path) -> dict[str, Any]:
    idle = await gateway.cpu_per_s(3.0)  # the browser run before it waited for the gateway to answer
    cps = 40.0
    ramp = config.g711_calls / cps + 3
    report = directory / "loadtest.json"
    argv = [sys.executable, "-m", "gateway", "loadtest", "--target", f"127.0.0.1:{gateway.sip_port}"]
    argv += ["--calls", str(config.g711_calls), "--cps", str(cps), "--duration", str(round(ramp + config.window_s + 3))]
    argv += ["--rtp-ports", "43000-44999", "--json", str(report)]
    load = BenchProcess("loadtest", argv, directory)
    pin(load.popen.pid, config.load_core)
    try:
        await asyncio.sleep(ramp)
        busy = await gateway.cpu_per_s(config.window_s)
        with contextlib.suppress(subprocess.TimeoutExpired):  # it stops by itself; stop() ends it otherwise
            await asyncio.to_thread(load.popen.wait, config.window_s + 30)
    finally:
        load.stop()
    summary = json.loads(report.read_text()) if report.is_file() else {}
    generator = summary.get("generator", {})
    row = {
        "calls": config.g711_calls,
        "core_pct": 100 * busy,
        "idle_pct": 100 * idle,
        "us_per_call_frame": (busy - idle) / (config.g711_calls * 50) * 1e6,
        "audio_right": summary.get("audio_ok"),
        "answered": summary.get("answered"),
        # what the load tester saw, to tell a call the worker got wrong from one its own core got wrong
        "packets_lost": summary.get("packets_lost"),
        "markers": f"{summary.get('markers_found')}/{summary.get('markers_expected')}",
        "slips": summary.get("slips"),
        "generator_overruns": generator.get("overruns"),
        "generator_max_lag_ms": generator.get("max_lag_ms"),
    }
    if row["audio_right"] != config.g711_calls:
        print(f"   G.711 calls not all right: {row}", file=sys.stderr, flush=True)
    return row


def _label(encoder: str, decoder: str) -> str:
    return f"browser, {encoder} encodes, {decoder} decodes"


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "calls": runs[0]["calls"],
        "us_per_call_frame": statistics.median(r["us_per_call_frame"] for r in runs),
        "runs_us": [round(r["us_per_call_frame"]) for r in runs],
        "core_pct": [round(r["core_pct"], 1) for r in runs],
        "audio_right": [r["audio_right"] for r in runs],
        "echo_ms": [round(r["echo_ms"]) for r in runs if "echo_ms" in r],
    }


def run(config: WebRtcBenchConfig, *, json_path: str | None = None) -> int:
    pin(os.getpid(), config.load_core)  # the browsers, in this process
    runs: dict[str, list[dict[str, Any]]] = {}
    pinned = False
    with tempfile.TemporaryDirectory(prefix="bench-webrtc-") as work:
        directory = Path(work)
        for repeat in range(config.repeats):
            for encoder, decoder in config.paths:
                label = _label(encoder, decoder)
                print(f"-- run {repeat + 1}: {label}", file=sys.stderr, flush=True)
                gateway = _Gateway(config, directory, encoder, decoder)
                try:
                    pinned = gateway.pinned
                    runs.setdefault(label, []).append(asyncio.run(_browser_run(config, gateway)))
                    if config.g711_calls and (encoder, decoder) == config.paths[0]:
                        print(f"-- run {repeat + 1}: G.711 SIP calls", file=sys.stderr, flush=True)
                        runs.setdefault("G.711 SIP (PCMU)", []).append(
                            asyncio.run(_g711_run(config, gateway, directory))
                        )
                finally:
                    gateway.stop()
    rows = {label: _median(values) for label, values in runs.items()}
    print(
        f"\nworker pinned: {pinned}, load cpus: {cpus_named(config.load_core)}; "
        f"µs per call-frame above the idle process, median of {config.repeats}"
    )
    print("| calls | what | µs per call-frame (runs) | core % | audio right | echo round trip, ms |")
    print("|---:|---|---|---|---|---|")
    for label, row in rows.items():
        runs_text = ", ".join(str(v) for v in row["runs_us"])
        right = ", ".join(str(v) for v in row["audio_right"])
        print(
            f"| {row['calls']} | {label} | **{row['us_per_call_frame']:.0f}** ({runs_text}) | "
            f"{', '.join(str(v) for v in row['core_pct'])} | {right} of {row['calls']} | "
            f"{', '.join(str(v) for v in row['echo_ms']) or '—'} |"
        )
    g711 = rows.get("G.711 SIP (PCMU)")
    first = rows[_label(*config.paths[0])]
    for encoder, decoder in config.paths[1:]:
        other = rows[_label(encoder, decoder)]
        print(
            f"{_label(encoder, decoder)} / {_label(*config.paths[0])}: "
            f"{other['us_per_call_frame'] / first['us_per_call_frame']:.2f}x"
        )
    if g711:
        print(f"a browser call / a G.711 call: {first['us_per_call_frame'] / g711['us_per_call_frame']:.1f}x")
    if json_path:
        Path(json_path).write_text(json.dumps({"runs": runs, "rows": rows, "pinned": pinned}, indent=2))
    wrong = [
        label
        for label, values in runs.items()
        if any(r["audio_right"] is not None and r["audio_right"] < r["calls"] for r in values)
    ]
    if wrong:
        print(f"audio not right in every call: {', '.join(wrong)}", file=sys.stderr)
        return 1
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", type=int, default=8, help="concurrent browser calls")
    parser.add_argument("--g711-calls", type=int, default=100, help="concurrent PCMU calls to compare with (0: none)")
    parser.add_argument("--window", type=float, default=10.0, help="measurement window, seconds")
    parser.add_argument("--repeats", type=int, default=3, help="runs (medians are reported)")
    parser.add_argument(
        "--encoder",
        choices=["both", "gateway", "aiortc"],
        default="gateway",
        help="who encodes the agent's Opus: the gateway's track, aiortc's sender, or both interleaved",
    )
    parser.add_argument(
        "--decoder",
        choices=["both", "gateway", "aiortc"],
        default="both",
        help="who decodes the caller's Opus: the gateway on its loop, aiortc's decoder thread, or both interleaved",
    )
    parser.add_argument("--worker-core", type=int, default=0, help="CPU `gateway run` is pinned to (-1: none)")
    parser.add_argument(
        "--load-core",
        type=arguments.cpus,
        default=(1,),
        help="CPU or CPUs for the browsers and the loadtest: 1, 1,2,3 or 2-5 (-1: none)",
    )
    parser.add_argument("--json", metavar="FILE", help="write every run as JSON")


def main(args: argparse.Namespace) -> int:
    try:
        webrtc_config = WebRtcBenchConfig(
            calls=args.calls,
            g711_calls=args.g711_calls,
            window_s=args.window,
            repeats=args.repeats,
            encoders=("gateway", "aiortc") if args.encoder == "both" else (args.encoder,),
            decoders=("gateway", "aiortc") if args.decoder == "both" else (args.decoder,),
            worker_core=None if args.worker_core < 0 else args.worker_core,
            load_core=args.load_core or None,
        )
    except ValueError as exc:
        raise SystemExit(f"gateway bench webrtc: {exc}") from None
    return run(webrtc_config, json_path=args.json)
