"""Call recordings in a real worker: a scripted SIP phone calls the echo agent with ``record`` set; the file
the worker writes is read back with the stdlib, soundfile and PyAV and compared with what was sent."""

from __future__ import annotations

import asyncio
import wave
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
import soundfile

from gateway.fleet.models import ProfileModel
from gateway.providers.echo import EchoConfig, EchoModel
from gateway.worker.recorder import Recordings, load_notice, recording_path
from gateway.worker.settings import WorkerSettings
from gateway.worker.sip_leg import CallLeg
from gateway.worker.worker import MediaWorker
from telcodecs.frames import FRAME_SAMPLES, Frame
from tests.gateway.worker.sip_peer import SipPeer
from tests.gateway.worker.test_worker import _answered, speechlike
from tests.support.audio import align_and_correlate, resample, tone, write_wav
from tests.support.procs import free_ports

pytestmark = pytest.mark.timeout(60)


@asynccontextmanager
async def recording_worker(directory: Path, profile: ProfileModel) -> AsyncIterator[MediaWorker]:
    rtp_low = free_ports(40)[0]
    rtp_low += rtp_low % 2
    settings = WorkerSettings(
        worker_id="w-rec",
        sip_port=free_ports(1)[0],
        rtp_ports=f"{rtp_low}-{rtp_low + 37}",
        capacity=8,
        recordings_dir=directory,
    )
    worker = MediaWorker(
        settings, model_factory=lambda name: EchoModel(EchoConfig(delay_frames=1)), default_profile=profile
    )
    await worker.start()
    try:
        yield worker
    finally:
        await worker.aclose()


async def _call(worker: MediaWorker, sent: np.ndarray) -> tuple[CallLeg, np.ndarray]:
    """One PCMU call that sends ``sent`` (8 kHz), lets the echo play out and hangs up; (its leg, what it heard)."""
    async with SipPeer() as peer:
        call = peer.invite(f"sip:agent@127.0.0.1:{worker.settings.sip.sip_port}", codecs=("PCMU",))
        await _answered(peer, call)
        await peer.stream(call, sent)
        await peer.stream(call, np.zeros(8000, np.int16), frames=15)
        [leg] = list(worker.legs.values())
        peer.hang_up(call)
        await asyncio.wait_for(leg.task, timeout=5)  # type: ignore[arg-type]
        return leg, peer.heard(call)


def _correlation(sent8k: np.ndarray, recorded: np.ndarray, rate: int) -> float:
    correlation, _ = align_and_correlate(resample(sent8k, 8000, rate), recorded, rate)
    return correlation


async def test_both_sides_are_recorded_in_stereo_on_the_calls_clock(tmp_path: Path) -> None:
    profile = ProfileModel(record="both", record_format="wav", record_sample_rate=16_000)
    sent = speechlike(2.0)
    async with recording_worker(tmp_path, profile) as worker:
        leg, heard = await _call(worker, sent)
    info = leg.recording
    assert info is not None and info.format == "wav" and info.channels == 2 and info.sample_rate == 16_000
    path = tmp_path / info.path
    assert info.path == recording_path(leg.id, "wav", leg.started_wall)
    assert info.bytes == path.stat().st_size > 44
    data, rate = soundfile.read(path, dtype="int16")
    assert rate == 16_000 and data.shape[1] == 2
    assert info.duration_s == pytest.approx(len(data) / rate, abs=0.001)
    assert 2.0 < info.duration_s < 6.0
    assert _correlation(sent, data[:, 0], rate) > 0.9  # left: the caller
    # right: the agent, as sent to the caller (the echo of the caller, delayed)
    assert _correlation(sent, data[:, 1], rate) > 0.9
    # and what the caller heard is that channel, sample for sample (one clock: no slip to follow)
    correlation, _ = align_and_correlate(resample(heard, 8000, rate), data[:, 1], rate, max_slip_seconds=0)
    assert correlation > 0.95
    # the same clock: the agent's echo lags the caller by the echo's delay, not by drift
    _, lag_left = align_and_correlate(resample(sent, 8000, rate), data[:, 0], rate)
    _, lag_right = align_and_correlate(resample(sent, 8000, rate), data[:, 1], rate)
    assert 0 < lag_right - lag_left < 0.3 * rate


async def test_the_notice_plays_before_the_agent_and_ogg_recordings_play(tmp_path: Path) -> None:
    notice = write_wav(tmp_path / "notice.wav", tone(1000, 0.6, 16_000), 16_000)
    profile = ProfileModel(record="agent", record_format="ogg", record_notice=str(notice))
    sent = speechlike(1.5)
    async with recording_worker(tmp_path / "rec", profile) as worker:
        leg, heard = await _call(worker, sent)
    # the caller heard the notice first: a 1 kHz tone in the first half second
    first = heard[:4000].astype(np.float64)
    spectrum = np.abs(np.fft.rfft(first))
    assert abs(np.argmax(spectrum) * 8000 / len(first) - 1000) < 20
    info = leg.recording
    assert info is not None and info.format == "ogg" and info.channels == 1
    with av.open(str(tmp_path / "rec" / info.path)) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name in ("opus", "libopus")
        decoded = np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(audio=0)])
    assert len(decoded) / 48_000 == pytest.approx(info.duration_s, abs=0.1)
    assert info.bytes > 0


def _cut_short(directory: Path, fmt: str, ticks: int) -> Path:
    """A recording as a killed worker leaves it: ticks written, the writer stopped with no close (no WAV header
    fix, no Ogg trailer)."""

    async def write_without_closing() -> None:
        recordings = Recordings(directory, worker_id="w-cut")
        profile = ProfileModel(record="both", record_sample_rate=24_000, record_format=fmt)  # type: ignore[arg-type]
        recorder = recordings.open("c-cut", profile, wall=0.0)
        assert recorder is not None
        pcm = np.asarray(tone(440, ticks / 50, 24_000))
        for i in range(ticks):
            recorder.caller = Frame(index=i, pcm=pcm[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES])
            recorder.agent = None
            recordings.tick(i)
        recordings._queue.put(None)
        assert recordings._thread is not None
        await asyncio.to_thread(recordings._thread.join)

    asyncio.run(write_without_closing())
    return directory / recording_path("c-cut", fmt, 0.0)  # type: ignore[arg-type]


def test_a_wav_recording_cut_short_plays_up_to_its_last_chunk(tmp_path: Path) -> None:
    path = _cut_short(tmp_path, "wav", 50)
    with wave.open(str(path)) as reader:
        frames = reader.readframes(10**6)
    assert len(frames) == 50 * FRAME_SAMPLES * 4  # every flushed chunk: 1 s of stereo
    data, rate = soundfile.read(path, dtype="int16")
    assert rate == 24_000 and data.shape == (50 * FRAME_SAMPLES, 2)
    assert np.abs(data[:, 0]).max() > 10_000 and not data[:, 1].any()
    with av.open(str(path)) as container:
        assert sum(f.samples for f in container.decode(audio=0)) == 50 * FRAME_SAMPLES


def test_an_ogg_recording_cut_short_plays_up_to_its_last_pages(tmp_path: Path) -> None:
    path = _cut_short(tmp_path, "ogg", 150)
    with av.open(str(path)) as container:
        decoded = sum(f.samples for f in container.decode(audio=0))
    # 3 s written; what the encoder and the last page still held (under half a second) is lost
    assert 2.5 * 48_000 <= decoded <= 3 * 48_000


def test_a_full_queue_drops_ticks_and_counts_them(tmp_path: Path) -> None:
    async def flood() -> tuple[int, Any]:
        recordings = Recordings(tmp_path, worker_id="w-full", queue_ticks=10)
        recorder = recordings.open("c-full", ProfileModel(record="caller"), wall=0.0)
        assert recorder is not None
        recordings._room = __import__("threading").BoundedSemaphore(10)
        for _ in range(10):
            assert recordings._room.acquire(blocking=False)  # the writer took nothing yet: the queue is full
        recordings.tick(1)
        dropped = recordings.dropped_ticks
        for _ in range(10):
            recordings._room.release()
        info = await recordings.close("c-full")
        await recordings.aclose()
        return dropped, info

    dropped, info = asyncio.run(flood())
    assert dropped == 1
    assert info is not None and info.duration_s == 0.0


def test_an_unreadable_notice_is_skipped_and_a_good_one_is_decoded_once(tmp_path: Path) -> None:
    good = write_wav(tmp_path / "n.wav", tone(500, 0.1, 8000), 8000)
    frames = load_notice(str(good))
    assert len(frames) == 5 and all(f.pcm.shape == (FRAME_SAMPLES,) for f in frames)
    assert load_notice(str(good)) is frames
    recordings = Recordings(tmp_path, worker_id="w-n")
    recorder = recordings.open("c-n", ProfileModel(record="caller", record_notice=str(tmp_path / "none.wav")), wall=0.0)
    assert recorder is not None and recorder.notice_frame(0) is None
    recordings._queue.put(None)


def test_a_stalled_disk_never_holds_the_calls_end(tmp_path: Path) -> None:
    """The file is a FIFO nobody reads: opening it blocks the writer thread as a hung network volume would."""
    import os

    path = tmp_path / recording_path("c-stall", "wav", 0.0)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)

    async def stall() -> tuple[Any, int]:
        recordings = Recordings(tmp_path, worker_id="w-stall", queue_ticks=10)
        recordings.close_timeout_s = 0.3
        recorder = recordings.open("c-stall", ProfileModel(record="caller"), wall=0.0)
        assert recorder is not None
        for tick in range(30):  # the queue fills: ticks are dropped, the tick never waits
            recordings.tick(tick)
        info = await recordings.close("c-stall")
        dropped = recordings.dropped_ticks
        reader = await asyncio.to_thread(os.open, path, os.O_RDONLY | os.O_NONBLOCK)  # the disk comes back
        try:
            await recordings.aclose()
        finally:
            os.close(reader)
        return info, dropped

    info, dropped = asyncio.run(stall())
    assert info is not None and info.path == "1970-01-01/c-stall.wav" and info.bytes == 0
    assert dropped == 20
