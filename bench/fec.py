"""``gateway bench fec``: how many of an Opus caller's lost packets in-band FEC mends, by jitter-buffer depth.

Opus (RFC 6716, with ``useinbandfec``) carries a lower-rate copy of each frame in the next packet, so a lost
frame can be decoded from its successor, if the successor is buffered when the lost frame's turn comes. A
buffer that runs at its shallowest (each packet arrives just in time for its own turn, which a 40 ms buffer
does whenever the sender's clock phase lands just after the tick's) never has it, and every loss is plain
concealment. The caller's jitter buffer grows the delay by a frame, in the caller's next pause, after such a
loss (``JitterBuffer(fec=True)``, gateway/media/jitter.py); this measures what that buys.

Speech (espeak-ng, else the built-in speech-like signal) is encoded with libopus as the tick's callers'
peers do (32 kbit/s, FEC on), packets are lost at random (seeded), and each stream is played through a
jitter buffer and decoded as the tick does it (``decode``, ``decode_fec`` of the next packet when the buffer
hands one out, else ``conceal``), two ways: the delay kept (``fec=False``) and grown for FEC (``fec=True``);
at two arrival phases: *shallow* (from the 30th packet on, each arrives one tick later, just in time) and
*deep* (the prefill's frame of margin kept). Quality is the SNR, frame by frame, against the same packets
decoded without loss, over the speech frames that were lost and over all speech frames; an inserted frame
moves what follows by 20 ms, so each frame is compared at the best of 0-3 frames of lag.
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import asdict, dataclass

import numpy as np
import numpy.typing as npt

from gateway.media import jitter
from gateway.media.jitter import JitterBuffer, JitterConfig
from telcodecs.g711 import pcm_is_quiet
from telcodecs.opus import OpusDecoder, OpusEncoder

FRAME = 960  # 20 ms at 48 kHz
SPEECH_RMS = 300.0  # frames below this level are pauses, not compared
MAX_LAG_FRAMES = 3
SNR_CAP_DB = 30.0  # an exact frame would be infinite; capped so a mean means something


@dataclass(frozen=True, slots=True)
class FecRun:
    """One stream played one way: what happened to its lost frames and how they sounded."""

    phase: str
    grows: bool
    seed: int
    lost: int
    mended: int  # concealed frames decoded from the next packet's FEC
    plain: int  # concealed frames with no FEC to hand (libopus PLC)
    inserted: int
    lost_snr_db: float
    speech_snr_db: float


def speech_packets(seconds: float) -> tuple[list[bytes], npt.NDArray[np.int16], str]:
    """``seconds`` of speech as 20 ms Opus packets, their lossless decode and the speech's source."""
    from gateway.loadtest.audio import espeak_speech, speech_like

    pcm = espeak_speech(48000)
    source = "espeak-ng"
    if pcm is None:
        pcm, source = speech_like(48000, 8.0), "built-in speech-like signal"
    frames = int(seconds * 50)
    pcm = np.resize(pcm, frames * FRAME).astype(np.int16)
    encoder = OpusEncoder(channels=1, bitrate=32000)
    packets = [encoder.encode(pcm[k * FRAME : (k + 1) * FRAME]) for k in range(frames)]
    decoder = OpusDecoder(channels_out=1)
    return packets, np.concatenate([decoder.decode(p) for p in packets]), source


def play(
    packets: list[bytes], lost: set[int], *, shallow: bool, grows: bool
) -> tuple[npt.NDArray[np.int16], JitterBuffer, int, int]:
    """The decoded stream a caller's buffer plays, one pop per tick; returns it, the buffer, mended, plain."""
    config = JitterConfig(warmup_packets=0, min_delay_ms=40, start_delay_ms=40)
    jb = JitterBuffer(clock_rate=48000, unit_samples=FRAME, units_per_frame=1, unit_bytes=0, config=config, fec=grows)
    decoder = OpusDecoder(channels_out=1)
    arrivals: dict[int, list[int]] = {}
    for k in range(len(packets)):
        if k not in lost:
            arrivals.setdefault(k + (1 if shallow and k >= 30 else 0), []).append(k)
    out, mended, plain = [], 0, 0
    silence = np.zeros(FRAME, dtype=np.int16)
    end = len(packets) * FRAME
    for tick in range(2 * len(packets)):
        if (last := jb.last_played()) is not None and last[1] == end:
            break  # the last packet played: what follows would be the stream's end concealed, not a loss
        for k in arrivals.get(tick, []):
            jb.push(k * FRAME, packets[k])
        jb.adapt(0.0, 100, 48000)
        inserted = jb.inserted
        payload = jb.pop()
        if payload is not None:
            pcm = decoder.decode(payload)
        elif jb.inserted > inserted:  # a frame of delay grown in a pause: concealment, but no loss
            pcm = decoder.conceal()
        elif jb.status == jitter.CONCEALED and jb.fec_payload is not None:
            pcm, mended = decoder.decode_fec(jb.fec_payload), mended + 1
        elif jb.status == jitter.CONCEALED:
            pcm, plain = decoder.conceal(), plain + 1
        else:
            pcm = silence
        if jb.wants_level:
            jb.heard(pcm_is_quiet(pcm))
        out.append(pcm)
    out.extend([silence] * MAX_LAG_FRAMES)
    return np.concatenate(out), jb, mended, plain


def frame_snrs(reference: npt.NDArray[np.int16], played: npt.NDArray[np.int16]) -> dict[int, float]:
    """SNR (dB) of each speech frame of ``reference`` in ``played``, at its best lag of 0-3 frames."""
    ref = reference.astype(np.float64).reshape(-1, FRAME)
    out = played.astype(np.float64)
    snrs = {}
    for k, frame in enumerate(ref):
        energy = float(frame @ frame)
        if energy < FRAME * SPEECH_RMS**2:
            continue
        best = -SNR_CAP_DB
        for lag in range(MAX_LAG_FRAMES + 1):
            heard = out[(k + lag) * FRAME : (k + lag + 1) * FRAME]
            error = frame - heard
            best = max(best, 10.0 * np.log10(energy / max(float(error @ error), 1e-9)))
        snrs[k] = min(best, SNR_CAP_DB)
    return snrs


def measure(*, seeds: int = 5, loss_pct: float = 3.0, seconds: float = 40.0) -> tuple[list[FecRun], str]:
    packets, reference, source = speech_packets(seconds)
    runs = []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        lost = {k for k in range(5, len(packets)) if rng.random() < loss_pct / 100}
        for phase in ("shallow", "deep"):
            for grows in (False, True):
                played, jb, mended, plain = play(packets, lost, shallow=phase == "shallow", grows=grows)
                snrs = frame_snrs(reference, played)
                lost_snrs = [snr for k, snr in snrs.items() if k in lost]
                runs.append(
                    FecRun(
                        phase=phase,
                        grows=grows,
                        seed=seed,
                        lost=len(lost),
                        mended=mended,
                        plain=plain,
                        inserted=jb.inserted,
                        lost_snr_db=statistics.fmean(lost_snrs) if lost_snrs else SNR_CAP_DB,
                        speech_snr_db=statistics.fmean(snrs.values()),
                    )
                )
    return runs, source


def run(*, seeds: int, loss_pct: float, seconds: float, json_output: bool) -> int:
    runs, source = measure(seeds=seeds, loss_pct=loss_pct, seconds=seconds)
    if json_output:
        print(json.dumps({"speech": source, "runs": [asdict(r) for r in runs]}))
        return 0
    print(f"gateway bench fec: {seconds:g} s of speech ({source}), {loss_pct:g} % of packets lost, {seeds} seeds")
    print(
        f"{'phase':8} {'jitter buffer':26} {'lost':>5} {'FEC mended':>11} {'plain PLC':>10} {'inserted':>9}"
        f" {'lost-frame SNR dB':>18} {'speech SNR dB':>14}"
    )
    for phase in ("shallow", "deep"):
        for grows in (False, True):
            rows = [r for r in runs if r.phase == phase and r.grows == grows]
            how = "grows a frame for FEC" if grows else "delay kept"
            print(
                f"{phase:8} {how:26} {statistics.median(r.lost for r in rows):>5.0f}"
                f" {statistics.median(r.mended for r in rows):>11.0f} {statistics.median(r.plain for r in rows):>10.0f}"
                f" {statistics.median(r.inserted for r in rows):>9.0f}"
                f" {statistics.median(r.lost_snr_db for r in rows):>18.2f}"
                f" {statistics.median(r.speech_snr_db for r in rows):>14.2f}"
            )
    print("(medians over the seeds; SNR against the same packets decoded without loss)")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.add_argument("--seeds", type=int, default=5, help="loss patterns (medians are reported)")
    parser.add_argument("--loss-pct", type=float, default=3.0, help="packets lost at random, percent")
    parser.add_argument("--seconds", type=float, default=40.0, help="speech per stream")


def main(args: argparse.Namespace) -> int:
    if args.seeds < 1 or not 0 < args.loss_pct < 50 or args.seconds < 2:
        raise SystemExit("gateway bench fec: --seeds >= 1, 0 < --loss-pct < 50 and --seconds >= 2")
    return run(seeds=args.seeds, loss_pct=args.loss_pct, seconds=args.seconds, json_output=args.json)
