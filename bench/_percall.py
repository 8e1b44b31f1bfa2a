"""The per-call media design, for ``gateway bench calls`` to compare against the batched tick.

This is how a call's media is usually written on top of aiortc/PyAV: every call runs its own task with its
own 20 ms timer (absolute deadlines, like aiortc's ``AudioStreamTrack``) and its own PyAV objects: a
``pcm_mulaw``/``pcm_alaw``/``libopus`` decoder and encoder and two ``AudioResampler`` (to and from 24 kHz),
with a small FIFO because libswresample returns variable-sized frames. Each tick of a call: pop the jitter
buffer, decode, resample, hand the frame to the session, take the session's outbound frame, resample, encode,
send RTP.

:class:`PerCallEngine` keeps the :class:`~gateway.media.tick.TickEngine` interface the worker drives (the
packet path, RTCP, statistics and call bookkeeping are the same code), but its shared ``tick_inbound`` /
``tick_outbound`` hand out nothing: the per-call tasks did the work. :func:`install` puts it into a
:class:`~gateway.worker.worker.MediaWorker` before the worker starts. Only the benchmark uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any

import av
import numpy as np

from gateway.media.call import MediaCall, MediaCallConfig
from gateway.media.rfc4733 import DtmfReceived
from gateway.media.tick import Datagram, InboundTick, OutboundFrame, TickEngine
from telcodecs.frames import FRAME_SAMPLES, Frame

log = logging.getLogger(__name__)

_CODECS = {"PCMU": ("pcm_mulaw", 8000, 160), "PCMA": ("pcm_alaw", 8000, 160), "opus": ("libopus", 48000, 960)}


class _Fifo:
    """Exactly ``size`` samples out per call, whatever sizes the resampler returned (zero-padded at start)."""

    __slots__ = ("buffer", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.buffer = np.zeros(0, dtype=np.int16)

    def push_frames(self, frames: list[av.AudioFrame]) -> None:
        if frames:
            self.buffer = np.concatenate([self.buffer, *(f.to_ndarray().reshape(-1) for f in frames)])

    def pop(self) -> np.ndarray:
        if self.buffer.size < self.size:
            out = np.zeros(self.size, dtype=np.int16)
            out[self.size - self.buffer.size :] = self.buffer
            self.buffer = self.buffer[:0]
            return out
        out, self.buffer = self.buffer[: self.size], self.buffer[self.size :]
        return out


class _CallDsp:
    """One call's PyAV objects (decoder, encoder, two resamplers) and FIFOs."""

    def __init__(self, codec: str) -> None:
        name, rate, samples = _CODECS[codec]
        self.rate = rate
        self.samples = samples
        self.decoder = av.CodecContext.create(name, "r")
        self.decoder.sample_rate = rate
        self.decoder.layout = "mono"
        self.encoder = av.CodecContext.create(name, "w")
        self.encoder.sample_rate = rate
        self.encoder.layout = "mono"
        self.encoder.format = "s16"
        if codec == "opus":
            self.encoder.bit_rate = 32000
        self.up = av.AudioResampler(format="s16", layout="mono", rate=24000)
        self.down = av.AudioResampler(format="s16", layout="mono", rate=rate)
        self.in_fifo = _Fifo(FRAME_SAMPLES)
        self.out_fifo = _Fifo(samples)
        self.pts = 0

    def decode(self, payload: bytes | None) -> np.ndarray:
        if payload is None:
            frame = av.AudioFrame.from_ndarray(np.zeros((1, self.samples), dtype=np.int16), format="s16", layout="mono")
            frame.sample_rate = self.rate
            decoded = [frame]
        else:
            decoded = list(self.decoder.decode(av.Packet(payload)))
        for frame in decoded:
            self.in_fifo.push_frames(self.up.resample(frame))
        return self.in_fifo.pop()

    def encode(self, pcm24: np.ndarray) -> bytes:
        frame = av.AudioFrame.from_ndarray(pcm24.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = 24000
        self.out_fifo.push_frames(self.down.resample(frame))
        out = av.AudioFrame.from_ndarray(self.out_fifo.pop().reshape(1, -1), format="s16", layout="mono")
        out.sample_rate = self.rate
        out.pts = self.pts
        self.pts += self.samples
        return b"".join(bytes(p) for p in self.encoder.encode(out))


class PerCallEngine(TickEngine):
    """See the module docstring. ``legs`` is the worker's call table (for sessions and sockets)."""

    def __init__(self, legs: Mapping[str, Any], *, wall_clock_offset: float = 0.0) -> None:
        super().__init__(wall_clock_offset=wall_clock_offset)
        self._legs = legs
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def add_call(self, config: MediaCallConfig, *, now: float) -> MediaCall:
        call = super().add_call(config, now=now)
        task = asyncio.get_running_loop().create_task(self._run_call(call), name=f"percall-{config.call_id}")
        self._tasks[config.call_id] = task
        return call

    def remove_call(self, call_id: str) -> list[Datagram]:
        task = self._tasks.pop(call_id, None)
        if task is not None:
            task.cancel()  # the task only sleeps and computes: nothing to await for cleanup
        return super().remove_call(call_id)

    @property
    def takes_g711(self) -> list[tuple[str, bool]]:
        """No call: each call's own task pulls its outbound frame, so the worker's tick must not pull one too
        (it would take every other frame of the agent's audio away from the caller)."""
        return []

    def tick_inbound(self, now: float) -> InboundTick:
        events: list[DtmfReceived] = []
        for call in self._calls.values():
            if call.events:
                events.extend(call.events)
                call.events.clear()
        return InboundTick(frames={}, events=events)

    def tick_outbound(self, outbound: Mapping[str, OutboundFrame], now: float) -> list[Datagram]:
        return []

    async def _run_call(self, call: MediaCall) -> None:
        loop = asyncio.get_running_loop()
        dsp = _CallDsp(call.config.codec)
        call_id = call.config.call_id
        deadline = loop.time()
        while True:
            deadline += 0.02
            # Always through the loop, as aiortc's tracks do (a late timer sleeps 0): a call that fell behind
            # reads the caller's packets between its catch-up ticks instead of popping an empty jitter buffer.
            await asyncio.sleep(max(deadline - loop.time(), 0.0))
            with contextlib.suppress(Exception):  # one call's DSP error must not end its timer
                self._call_tick(call, call_id, dsp, loop.time())

    def _call_tick(self, call: MediaCall, call_id: str, dsp: _CallDsp, now: float) -> None:
        jb = call.jitter_buffer
        rx = call.reception
        jb.adapt(rx.jitter, rx.received, dsp.rate)
        pcm24 = dsp.decode(jb.pop())
        pcm24.flags.writeable = False
        frame = Frame(index=call.inbound_index, pcm=pcm24)
        call.inbound_index += 1
        leg = self._legs.get(call_id)
        session = getattr(leg, "session", None)
        out = None
        if session is not None:
            session.push_inbound(frame)
            out = session.pull_outbound()
        payload = dsp.encode(out.pcm if out is not None else np.zeros(FRAME_SAMPLES, dtype=np.int16))
        packet = call.next_packet(payload, out is not None, now)
        rtp = getattr(leg, "rtp", None)
        if packet is not None and rtp is not None:
            rtp.send_rtp(packet, call.send_address)


def install(worker: Any) -> None:
    """Replace a (not yet started) MediaWorker's batched engine with the per-call design."""
    worker.engine = PerCallEngine(worker.legs, wall_clock_offset=worker.engine.wall_clock_offset)
