"""Call recordings, the I/O half: one writer thread per worker that turns recorded calls' ticks into files.

The tick never waits on a disk. Each tick, for every recorded call, it hands the two frames it already holds
(what the caller sent, what was sent to the caller) to :class:`Recordings`, which puts the tick's batch on a
queue drained by one writer thread; the queue is bounded in ticks by a semaphore taken without blocking, so a
writer that falls behind (a slow disk) costs dropped ticks, counted in
``gateway_recording_ticks_dropped_total`` and written as silence so that what follows stays aligned, never a
late tick. The thread mixes each tick of every recorded call at once
(:class:`~gateway.media.recording.RecordingMixdown`: one batched resampling per rate), buffers a fraction of a
second and writes it out: a WAV file with the streaming header (rewritten with the real sizes on
close) or Ogg/Opus through PyAV with short pages flushed as they are made. A worker killed mid-call leaves a
file that plays up to its last chunk or page.

Files are ``<recordings dir>/<UTC date>/<call id>.<wav|ogg>``; the call's record carries the path relative to
the directory, so the control plane serves it from the same directory (shared by the processes of one host or
a mounted volume). A recording notice (an audio file, decoded once per path and kept) is played to the caller
before anything of the agent: while it lasts, the tick sends the notice instead of pulling the session's audio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Final, Literal

import numpy as np

from gateway.fleet.models import ProfileModel, RecordingModel
from gateway.media.recording import RecordFormat, RecordingMixdown, RecordingTrack, RecordMode, wav_header
from gateway.media.tick import OutboundFrame
from gateway.observability import RECORDING_TICKS_DROPPED_TOTAL, RECORDINGS_TOTAL
from telcodecs.frames import FRAME_SAMPLES, SAMPLE_RATE, Frame, unchecked_frame

log = logging.getLogger(__name__)

FLUSH_TICKS: Final = 10  # buffered ticks per write: what a killed worker may lose at most, besides the OS's
DEFAULT_QUEUE_TICKS: Final = 250
OPUS_BITS_PER_CHANNEL: Final = 16_000
CLOSE_TIMEOUT_S: Final = 10.0
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

__all__ = ["CallRecorder", "Recordings", "load_notice", "recording_path"]


def recording_path(call_id: str, fmt: RecordFormat, wall: float) -> str:
    """``<UTC date>/<call id>.<ext>``: the path of a call's recording relative to the recordings directory."""
    day = time.strftime("%Y-%m-%d", time.gmtime(wall))
    name = _UNSAFE.sub("_", call_id)[:128] or "call"
    return f"{day}/{name}.{fmt}"


_notices: dict[str, tuple[Frame, ...]] = {}


def load_notice(path: str) -> tuple[Frame, ...]:
    """The frames of an audio file (any format FFmpeg reads) at 24 kHz mono, decoded once per path.

    Raises OSError or ``av.error.FFmpegError`` for a file that cannot be read."""
    frames = _notices.get(path)
    if frames is not None:
        return frames
    import av

    chunks: list[np.ndarray[Any, np.dtype[np.int16]]] = []
    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    with av.open(path) as container:
        for decoded in container.decode(audio=0):
            for out in resampler.resample(decoded):
                chunks.append(out.to_ndarray().reshape(-1).astype(np.int16))
        for out in resampler.resample(None):
            chunks.append(out.to_ndarray().reshape(-1).astype(np.int16))
    pcm = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
    count = -(-len(pcm) // FRAME_SAMPLES)
    padded = np.zeros(count * FRAME_SAMPLES, dtype=np.int16)
    padded[: len(pcm)] = pcm
    padded.flags.writeable = False
    frames = tuple(unchecked_frame(i, padded[i * FRAME_SAMPLES : (i + 1) * FRAME_SAMPLES]) for i in range(count))
    _notices[path] = frames
    return frames


class CallRecorder:
    """The tick's side of one call's recording: the frames of the current tick and the notice still to play."""

    __slots__ = ("_notice", "_notice_at", "_writer", "agent", "call_id", "caller", "info")

    def __init__(self, call_id: str, writer: _FileWriter, info: RecordingModel, notice: tuple[Frame, ...]) -> None:
        self.call_id = call_id
        self.info = info
        self.caller: Frame | None = None
        self.agent: OutboundFrame = None
        self._writer = writer
        self._notice = notice
        self._notice_at = 0

    def notice_frame(self, index: int) -> Frame | None:
        """The notice's next frame for the caller (numbered ``index``), or None once it has all been played."""
        at = self._notice_at
        if at >= len(self._notice):
            return None
        self._notice_at = at + 1
        return unchecked_frame(index, self._notice[at].pcm)


class _FileWriter:
    """The writer thread's side of one recording: buffers its mixed ticks and appends them to the file."""

    def __init__(self, path: Path, info: RecordingModel, mode: RecordMode) -> None:
        self.path = path
        self.info = info
        self.mode: RecordMode = mode
        self.track: RecordingTrack | None = None  # its place in the thread's mixdown, from open() on
        self.flush_bytes = FLUSH_TICKS * 2 * info.channels * (info.sample_rate // 50)
        self.buffer = bytearray()
        self.audio_bytes = 0
        self.failed = False
        self._file: IO[bytes] | None = None
        self._ogg: _OggFile | None = None

    def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.info.format == "wav":
            self._file = self.path.open("wb")
            self._file.write(
                wav_header(sample_rate=self.info.sample_rate, channels=self.info.channels, data_bytes=None)
            )
            self._file.flush()
        else:
            self._ogg = _OggFile(self.path, self.info.sample_rate, self.info.channels)

    def write(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) >= self.flush_bytes:
            self.flush()

    def flush(self) -> None:
        data = bytes(self.buffer)
        self.buffer.clear()
        if not data:
            return
        self.audio_bytes += len(data)
        if self._file is not None:
            self._file.write(data)
            self._file.flush()
        elif self._ogg is not None:
            self._ogg.write(data)

    def finish(self) -> RecordingModel:
        self.flush()
        if self._file is not None:
            self._file.seek(0)
            header = wav_header(
                sample_rate=self.info.sample_rate, channels=self.info.channels, data_bytes=self.audio_bytes
            )
            self._file.write(header)
            self._file.close()
            self._file = None
        elif self._ogg is not None:
            self._ogg.close()
            self._ogg = None
        duration = self.audio_bytes / (2 * self.info.channels * self.info.sample_rate)
        return self.info.model_copy(update={"bytes": self.path.stat().st_size, "duration_s": round(duration, 3)})

    def abandon(self) -> None:
        for closer in (self._file, self._ogg):
            if closer is not None:
                with contextlib.suppress(Exception):  # closing after a failure: the first error was logged
                    closer.close()
        self._file = self._ogg = None


class _OggFile:
    """Opus in Ogg through PyAV (libopus): pages of a quarter second, flushed to the file as they are made.

    Speech for review, not music: 16 kbit/s per channel, 60 ms Opus frames and libopus complexity 3, which costs
    a fraction of the default complexity 10 for a slightly larger file (docs/performance/2026-12-07-recording.md).
    PyAV cuts the chunks it is given into the encoder's frames."""

    def __init__(self, path: Path, rate: int, channels: int) -> None:
        import av

        layout = "stereo" if channels == 2 else "mono"
        self._av = av
        self._layout = layout
        self._rate = rate
        self._channels = channels
        self._pts = 0
        self.container = av.open(
            str(path), mode="w", format="ogg", options={"page_duration": "250000", "flush_packets": "1"}
        )
        self.stream = self.container.add_stream(
            "libopus", rate=rate, layout=layout, options={"frame_duration": "60", "compression_level": "3"}
        )
        self.stream.bit_rate = OPUS_BITS_PER_CHANNEL * channels

    def write(self, data: bytes) -> None:
        pcm = np.frombuffer(data, dtype="<i2")
        frame = self._av.AudioFrame.from_ndarray(pcm.reshape(1, -1), format="s16", layout=self._layout)
        frame.sample_rate = self._rate
        frame.pts = self._pts
        self._pts += len(pcm) // self._channels
        for packet in self.stream.encode(frame):
            self.container.mux(packet)

    def close(self) -> None:
        for packet in self.stream.encode(None):
            self.container.mux(packet)
        self.container.close()


@dataclass(frozen=True, slots=True)
class _Batch:
    """One tick of every recorded call: (writer, caller frame, frame sent to the caller) each."""

    tick: int
    entries: list[tuple[_FileWriter, Frame | None, OutboundFrame]]


@dataclass(frozen=True, slots=True)
class _Command:
    """Open a recording's file, or close it and hand its description to ``done``."""

    kind: Literal["open", "close"]
    writer: _FileWriter
    done: Callable[[RecordingModel | None], None]


class Recordings:
    """Every recording of one worker: the recorders the tick fills, and the writer thread that drains them."""

    def __init__(self, directory: Path, *, worker_id: str, queue_ticks: int = DEFAULT_QUEUE_TICKS) -> None:
        self.directory = directory
        self.recorders: dict[str, CallRecorder] = {}
        self.dropped_ticks = 0
        self.close_timeout_s = CLOSE_TIMEOUT_S
        self._queue: queue.SimpleQueue[_Batch | _Command | None] = queue.SimpleQueue()
        self._room = threading.BoundedSemaphore(queue_ticks)
        self._thread: threading.Thread | None = None
        self._dropped = RECORDING_TICKS_DROPPED_TOTAL.labels(worker_id)
        self._worker_id = worker_id

    def open(self, call_id: str, profile: ProfileModel, *, wall: float | None = None) -> CallRecorder | None:
        """Start recording a call per its profile (None when the profile records nothing); its file is made by
        the writer thread. A notice that cannot be read is logged and skipped: the call goes on."""
        if profile.record == "off" or call_id in self.recorders:
            return self.recorders.get(call_id)
        relative = recording_path(call_id, profile.record_format, time.time() if wall is None else wall)
        info = RecordingModel(
            path=relative,
            format=profile.record_format,
            channels=2 if profile.record == "both" else 1,
            sample_rate=profile.record_sample_rate,
        )
        notice: tuple[Frame, ...] = ()
        if profile.record_notice:
            try:
                notice = load_notice(profile.record_notice)
            except Exception as exc:  # an unreadable notice must not keep the call from going on
                log.warning("call %s: recording notice %s cannot be read: %s", call_id, profile.record_notice, exc)
        writer = _FileWriter(self.directory / relative, info, profile.record)
        recorder = CallRecorder(call_id, writer, info, notice)
        self.recorders[call_id] = recorder
        self._start_thread()
        self._queue.put(_Command("open", writer, _nothing))
        log.info("call %s: recording %s to %s", call_id, profile.record, relative)
        return recorder

    def tick(self, tick_no: int) -> None:
        """Hand this tick's frames of every recorded call to the writer (or count the tick dropped)."""
        recorders = self.recorders
        if not recorders:
            return
        if not self._room.acquire(blocking=False):
            self.dropped_ticks += 1
            self._dropped.inc()
            for recorder in recorders.values():
                recorder.caller = recorder.agent = None
            return
        entries: list[tuple[_FileWriter, Frame | None, OutboundFrame]] = []
        for recorder in recorders.values():
            entries.append((recorder._writer, recorder.caller, recorder.agent))
            recorder.caller = recorder.agent = None
        self._queue.put(_Batch(tick_no, entries))

    async def close(self, call_id: str) -> RecordingModel | None:
        """Stop recording a call; its final description once the writer has closed the file."""
        recorder = self.recorders.pop(call_id, None)
        if recorder is None:
            return None
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[RecordingModel | None] = loop.create_future()

        def done(result: RecordingModel | None) -> None:
            loop.call_soon_threadsafe(_settle, finished, result)

        self._queue.put(_Command("close", recorder._writer, done))
        try:
            # A disk that stalls must not keep the call from ending: its record then says where the file is.
            result = await asyncio.wait_for(finished, timeout=self.close_timeout_s)
        except TimeoutError:
            log.warning(
                "call %s: recording %s not finished within %.0f s", call_id, recorder.info.path, self.close_timeout_s
            )
            return recorder.info
        RECORDINGS_TOTAL.labels(self._worker_id, "written" if result is not None else "failed").inc()
        if result is not None:
            log.info(
                "call %s: recording finished: %s, %.1f s, %d bytes",
                call_id,
                result.path,
                result.duration_s,
                result.bytes,
            )
        return result

    def _start_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="recordings-writer", daemon=True)
            self._thread.start()

    async def aclose(self) -> None:
        """Close every recording still open, then stop the writer thread."""
        for call_id in list(self.recorders):
            await self.close(call_id)
        thread = self._thread
        if thread is not None:
            self._queue.put(None)
            await asyncio.to_thread(thread.join)
            self._thread = None

    def _run(self) -> None:
        mixdown = RecordingMixdown()  # the thread's own: only this thread touches it
        while (item := self._queue.get()) is not None:
            if isinstance(item, _Batch):
                try:
                    self._write(mixdown, item)
                finally:
                    self._room.release()
            elif item.kind == "open":
                writer = item.writer
                writer.track = mixdown.open(mode=writer.mode, sample_rate=writer.info.sample_rate)
                self._guard(writer, writer.open)
            else:
                if item.writer.track is not None:
                    mixdown.close(item.writer.track)
                    item.writer.track = None
                item.done(self._finish(item.writer))

    def _write(self, mixdown: RecordingMixdown, batch: _Batch) -> None:
        writers: list[_FileWriter] = []
        entries: list[tuple[RecordingTrack, Frame | None, OutboundFrame]] = []
        for writer, caller, agent in batch.entries:
            if not writer.failed and writer.track is not None:
                writers.append(writer)
                entries.append((writer.track, caller, agent))
        try:
            chunks = mixdown.mix(batch.tick, entries)
        except Exception:  # a bug of ours: the tick is lost (its recordings go on), never the thread
            log.exception("recordings: tick %d cannot be mixed; written as silence", batch.tick)
            return
        for writer, chunk in zip(writers, chunks, strict=True):
            self._guard(writer, writer.write, chunk)

    @staticmethod
    def _finish(writer: _FileWriter) -> RecordingModel | None:
        if writer.failed:
            return None
        try:
            return writer.finish()
        except Exception:
            log.exception("recording %s cannot be finished", writer.path)
            writer.abandon()
            return None

    @staticmethod
    def _guard(writer: _FileWriter, step: Callable[..., None], *args: Any) -> None:
        try:
            step(*args)
        except Exception:
            log.exception("recording %s failed; the call goes on without it", writer.path)
            writer.failed = True
            writer.abandon()


def _nothing(_: RecordingModel | None) -> None:
    return None


def _settle(future: asyncio.Future[RecordingModel | None], result: RecordingModel | None) -> None:
    if not future.done():
        future.set_result(result)
