"""A browser caller's audio on its way in: the Opus sink that replaces aiortc's decoder thread (decoding to 24 kHz),
and aiortc's 48 kHz frames -> 24 kHz.

The sink is fed real Opus packets (libopus through :class:`telcodecs.opus.OpusEncoder`) with the timestamps
aiortc's receiver gives them; what comes out must be the tone that went in, on the caller's timeline: a short
gap filled, a pause left a pause, a late frame dropped, a packet libopus rejects counted and concealed.
"""

from __future__ import annotations

import queue
import threading

import av
import numpy as np
import numpy.typing as npt
from aiortc import RTCPeerConnection
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket

from gateway.transport import webrtc_receive
from gateway.transport.webrtc_receive import (
    MAX_CONCEAL_FRAMES,
    WIRE_SAMPLES,
    InboundAudio,
    OpusReceiveSink,
)
from telcodecs.frames import FRAME_SAMPLES, Frame
from telcodecs.frames import SAMPLE_RATE as SESSION_RATE
from telcodecs.opus import OpusEncoder
from tests.gateway.transport.test_webrtc import RATE, dominant_hz, tone


def opus_packets(freq: float, count: int) -> list[bytes]:
    encoder = OpusEncoder(channels=1)
    pcm = tone(freq, WIRE_SAMPLES * count, RATE)
    return [encoder.encode(pcm[i * WIRE_SAMPLES : (i + 1) * WIRE_SAMPLES]) for i in range(count)]


class Collected:
    def __init__(self) -> None:
        self.pieces: list[npt.NDArray[np.int16]] = []

    def __call__(self, pcm: npt.NDArray[np.int16]) -> None:
        self.pieces.append(pcm)

    @property
    def samples(self) -> int:
        return sum(p.size for p in self.pieces)


def test_the_sink_decodes_each_frame_to_24k_mono_with_the_tone_sent() -> None:
    out = Collected()
    sink = OpusReceiveSink(out)
    for i, payload in enumerate(opus_packets(700, 25)):
        sink.receive(payload, 5_000 + i * WIRE_SAMPLES)  # timestamps as aiortc's mapper gives them
    # 20 ms at 24 kHz each: libopus decodes to the session's rate, so nothing is resampled on the way in.
    assert [p.size for p in out.pieces] == [FRAME_SAMPLES] * 25 and all(p.dtype == np.int16 for p in out.pieces)
    pcm = np.concatenate(out.pieces)
    assert abs(dominant_hz(pcm[FRAME_SAMPLES * 2 :], SESSION_RATE) - 700) < 20
    assert 0.2 < np.abs(pcm[FRAME_SAMPLES * 2 :]).max() / 32767 < 0.4
    assert (sink.frames, sink.concealed, sink.late, sink.bad_packets) == (25, 0, 0, 0)


def test_a_short_gap_is_concealed_and_a_pause_is_not() -> None:
    packets = opus_packets(500, 30)
    out = Collected()
    sink = OpusReceiveSink(out)
    ts = [i * WIRE_SAMPLES for i in range(30)]
    for i in (0, 1, 2, 3, 6, 7):  # frames 4 and 5 lost: two 20 ms frames concealed, the timeline kept
        sink.receive(packets[i], ts[i])
    assert sink.concealed == 2 and out.samples == 8 * FRAME_SAMPLES
    assert sink.bridged == 1  # the gap's last frame leans on the packet after it
    assert sink.frames == 6  # and that packet was decoded once, not again for the bridge
    concealed = np.concatenate(out.pieces[4:6])
    assert np.abs(concealed).max() > 1000  # the voice continues through the gap, not silence
    assert abs(dominant_hz(concealed, SESSION_RATE) - 500) < 30
    # A gap longer than MAX_CONCEAL_FRAMES is the sender pausing (DTX, mute): nothing is made up.
    resume = 8 + MAX_CONCEAL_FRAMES + 5
    sink.receive(packets[resume], ts[resume])
    assert sink.concealed == 2 and out.samples == 9 * FRAME_SAMPLES
    # A frame from before what was already played is dropped and counted.
    sink.receive(packets[9], ts[9])
    assert sink.late == 1 and out.samples == 9 * FRAME_SAMPLES
    # Timestamps that start over (more than a second back) are followed, not taken as late.
    sink.receive(packets[20], ts[resume] - 60 * WIRE_SAMPLES)
    sink.receive(packets[21], ts[resume] - 59 * WIRE_SAMPLES)
    assert sink.late == 1 and sink.concealed == 2 and out.samples == 11 * FRAME_SAMPLES


def test_a_packet_libopus_rejects_is_counted_and_concealed_and_the_call_goes_on() -> None:
    packets = opus_packets(900, 10)
    out = Collected()
    sink = OpusReceiveSink(out)
    for i in range(4):
        sink.receive(packets[i], i * WIRE_SAMPLES)
    sink.receive(b"\xff", 4 * WIRE_SAMPLES)  # code 3 without its frame-count byte (RFC 6716 §3.2.5)
    assert sink.bad_packets == 1 and sink.concealed == 1
    for i in range(5, 10):
        sink.receive(packets[i], i * WIRE_SAMPLES)
    assert sink.frames == 9 and sink.concealed == 1 and out.samples == 10 * FRAME_SAMPLES
    assert abs(dominant_hz(np.concatenate(out.pieces[5:]), SESSION_RATE) - 900) < 30


def _packet(seq: int, payload: bytes) -> RtpPacket:
    packet = RtpPacket(payload_type=111, sequence_number=seq, timestamp=seq * WIRE_SAMPLES)
    packet._data = payload  # type: ignore[attr-defined]  # what aiortc's depayloading leaves
    return packet


def test_the_sink_speaks_the_queue_calls_aiortc_makes() -> None:
    out = Collected()
    sink = OpusReceiveSink(out)
    packets = opus_packets(440, 4)
    assert sink.get() is None  # the decoder thread aiortc starts reads None and ends
    sink.add(_packet(0, packets[0]))
    assert out.samples == FRAME_SAMPLES
    sink.put(None)  # aiortc stopping its decoder
    assert sink.closed
    sink.add(_packet(1, packets[1]))  # nothing is decoded after the stop
    assert out.samples == FRAME_SAMPLES


def test_a_failure_behind_the_sink_is_counted_and_does_not_reach_aiortc() -> None:
    def broken(pcm: npt.NDArray[np.int16]) -> None:
        raise RuntimeError("a bug downstream")

    sink = OpusReceiveSink(broken)
    packets = opus_packets(440, 3)
    for i, payload in enumerate(packets):
        assert sink.add(_packet(i, payload)) == (False, None)  # must not raise into the packet handler
    assert sink.errors == 3 and sink.frames == 3


async def test_install_takes_the_place_of_a_new_receivers_jitter_buffer_and_queue() -> None:
    pc = RTCPeerConnection()
    try:
        receiver = pc.addTransceiver("audio").receiver
        sink = OpusReceiveSink(Collected())
        assert webrtc_receive.install(receiver, sink)
        assert receiver._RTCRtpReceiver__jitter_buffer is sink
        assert receiver._RTCRtpReceiver__decoder_queue is sink
        # A receiver whose decoder thread runs, or an aiortc that keeps its queue elsewhere, is left alone.
        other = pc.addTransceiver("audio").receiver
        running = threading.Thread(target=lambda: None)
        other._RTCRtpReceiver__decoder_thread = running
        assert not webrtc_receive.install(other, OpusReceiveSink(Collected()))
        assert isinstance(other._RTCRtpReceiver__decoder_queue, queue.Queue)
        assert isinstance(other._RTCRtpReceiver__jitter_buffer, JitterBuffer)
        other._RTCRtpReceiver__decoder_thread = None
        assert not webrtc_receive.install(object(), OpusReceiveSink(Collected()))
    finally:
        await pc.close()


# ----------------------------------------------------------------------------------------- order


class Order:
    """A sink whose decoding is recorded instead of done: which timestamps reached the decoder, when."""

    def __init__(self) -> None:
        self.sink = OpusReceiveSink(Collected())
        self.decoded: list[int] = []
        self.sink.receive = lambda payload, timestamp: self.decoded.append(timestamp)  # type: ignore[method-assign]

    def arrive(self, *sequences: int, base_ts: int = 0) -> list[int]:
        """Packets arrive (20 ms each, timestamp 960 * seq); returns the frame numbers decoded meanwhile."""
        before = len(self.decoded)
        for seq in sequences:
            self.sink.arrived(seq & 0xFFFF, (base_ts + seq * WIRE_SAMPLES) & 0xFFFF_FFFF, b"opus")
        return [ts // WIRE_SAMPLES for ts in self.decoded[before:]]


def test_packets_in_order_are_decoded_as_they_arrive_not_held_like_aiortcs_jitter_buffer() -> None:
    order = Order()
    assert [order.arrive(seq) for seq in range(5)] == [[0], [1], [2], [3], [4]]
    theirs = JitterBuffer(capacity=16, prefetch=4)  # what aiortc's receiver uses for audio
    out = []
    for seq in range(5):
        packet = RtpPacket(payload_type=111, sequence_number=seq, timestamp=seq * WIRE_SAMPLES)
        packet._data = b"opus"  # type: ignore[attr-defined]
        out.append(theirs.add(packet)[1])
    assert out[:4] == [None] * 4  # four frames of prefetch: the first comes out 80 ms after it arrived
    assert out[4] is not None and out[4].timestamp == 0


def test_a_reordered_packet_is_put_back_in_place() -> None:
    order = Order()
    assert order.arrive(0, 1) == [0, 1]
    assert order.arrive(3) == []  # waits for 2
    assert order.arrive(2) == [2, 3]
    assert order.arrive(4) == [4]
    assert order.sink.late == 0


def test_a_lost_packet_costs_40_ms_once_and_no_lasting_delay() -> None:
    order = Order()
    order.arrive(*range(10))
    assert order.arrive(11) == [] and order.arrive(12) == []  # 10 is missing: 11 and 12 wait
    assert order.arrive(13) == [11, 12, 13]  # given up: the decoder's timestamps show the gap, concealed there
    assert [order.arrive(seq) for seq in range(14, 30)] == [[seq] for seq in range(14, 30)]  # no lag after it
    assert order.arrive(10) == [] and order.sink.late == 1  # the lost packet, too late, is dropped
    # aiortc's buffer, after the same loss, stays 14 packets (280 ms) behind for the rest of the call.
    theirs = JitterBuffer(capacity=16, prefetch=4)
    lag = []
    for seq in (s for s in range(60) if s != 10):
        packet = RtpPacket(payload_type=111, sequence_number=seq, timestamp=seq * WIRE_SAMPLES)
        packet._data = b"opus"  # type: ignore[attr-defined]
        frame = theirs.add(packet)[1]
        if frame is not None:
            lag.append(seq - frame.timestamp // WIRE_SAMPLES)
    assert lag[0] == 4 and lag[-1] == 14


def test_sequence_numbers_and_timestamps_wrap_and_a_new_stream_is_followed() -> None:
    order = Order()
    start = 0xFFFF - 2
    base = 0xFFFF_FFFF - (start + 4) * WIRE_SAMPLES  # the timestamps pass 2^32 with the sequence numbers
    assert order.arrive(start, start + 1, start + 2, base_ts=base) != []
    decoded = order.arrive(start + 3, start + 4, start + 5, base_ts=base)  # 65535 -> 0 -> 1
    assert len(decoded) == 3 and order.sink.late == 0
    assert order.decoded[-1] - order.decoded[-2] == WIRE_SAMPLES
    assert order.decoded[-2] - order.decoded[-3] == WIRE_SAMPLES
    # A sender that starts over far back (a new stream) is followed at once, not dropped as late.
    before = len(order.decoded)
    order.arrive(60_000, 60_001, base_ts=5_000)
    assert len(order.decoded) == before + 2 and order.sink.late == 0
    # One that jumps far ahead is followed once the reorder wait is over.
    assert order.arrive(61_000, 61_001) == [] and len(order.arrive(61_002)) == 3


def test_packets_through_the_jitter_buffer_surface_are_decoded() -> None:
    out = Collected()
    sink = OpusReceiveSink(out)
    for seq, payload in enumerate(opus_packets(600, 10)):
        packet = RtpPacket(payload_type=111, sequence_number=seq + 100, timestamp=seq * WIRE_SAMPLES + 7)
        packet._data = payload  # type: ignore[attr-defined]  # what aiortc's depayloading leaves
        assert sink.add(packet) == (False, None)  # nothing for aiortc's decoder thread
    assert sink.frames == 10 and out.samples == 10 * FRAME_SAMPLES
    assert abs(dominant_hz(np.concatenate(out.pieces[2:]), SESSION_RATE) - 600) < 20


# --------------------------------------------------------------------------------- 48k -> 24k


def test_inbound_pcm48_in_20ms_pieces_becomes_24k_frames_with_the_same_tone() -> None:
    inbound = InboundAudio()
    pcm = tone(1000, 960 * 10, RATE)
    frames: list[Frame] = []
    for i in range(10):
        frames += inbound.feed_pcm48(pcm[i * 960 : (i + 1) * 960])
    assert [f.index for f in frames] == list(range(10))
    out = np.concatenate([f.pcm for f in frames])
    assert out.size == 10 * FRAME_SAMPLES
    assert abs(dominant_hz(out[480:], 24_000) - 1000) < 30
    # A 10 ms and a 40 ms packet in between: reframed on the same timeline.
    frames = inbound.feed_pcm48(pcm[:480]) + inbound.feed_pcm48(pcm[480:2400]) + inbound.feed_pcm48(pcm[2400:2880])
    assert [f.index for f in frames] == [10, 11, 12]


def test_inbound_pcm24_is_framed_as_it_is_whatever_the_packet_duration() -> None:
    inbound = InboundAudio()
    pcm = tone(1000, FRAME_SAMPLES * 4, SESSION_RATE)
    first = inbound.feed_pcm24(pcm[:FRAME_SAMPLES])
    assert len(first) == 1 and np.array_equal(first[0].pcm, pcm[:FRAME_SAMPLES])  # not resampled: the same samples
    # A 10 ms, a 30 ms and a 20 ms packet: whole frames out, in order, sample for sample.
    pieces = (FRAME_SAMPLES // 2, FRAME_SAMPLES * 3 // 2, FRAME_SAMPLES)
    frames, start = [], FRAME_SAMPLES
    for size in pieces:
        frames += inbound.feed_pcm24(pcm[start : start + size])
        start += size
    assert [f.index for f in frames] == [1, 2, 3]
    assert np.array_equal(np.concatenate([f.pcm for f in frames]), pcm[FRAME_SAMPLES:])


def test_inbound_stereo_packed_48k_becomes_24k_frames_with_the_same_tone() -> None:
    inbound = InboundAudio()
    left = tone(1000, 960 * 10, RATE)
    stereo = np.stack((left, left), axis=1).reshape(1, -1)  # packed s16: L R L R ...
    frames: list[Frame] = []
    for i in range(10):
        piece = np.ascontiguousarray(stereo[:, i * 1920 : (i + 1) * 1920])
        frame = av.AudioFrame.from_ndarray(piece, format="s16", layout="stereo")
        frame.sample_rate = RATE
        frames += inbound.feed(frame)
    assert [f.index for f in frames] == list(range(10))
    pcm = np.concatenate([f.pcm for f in frames])
    assert pcm.size == 10 * FRAME_SAMPLES
    assert abs(dominant_hz(pcm[480:], 24_000) - 1000) < 30
    assert 0.25 < np.max(np.abs(pcm[480:])) / 32767 < 0.35


def test_inbound_planar_downmix_and_odd_piece_sizes_are_reframed() -> None:
    inbound = InboundAudio()
    left = tone(600, 960 * 6, RATE, amplitude=0.4)
    right = np.zeros_like(left)  # the downmix halves a one-sided signal
    planar = np.stack((left, right))
    frames: list[Frame] = []
    start = 0
    for size in (300, 1000, 700, 2000, 1760):  # 5760 samples = 6 frames in uneven pieces
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(planar[:, start : start + size]), format="s16p", layout="stereo"
        )
        frame.sample_rate = RATE
        frames += inbound.feed(frame)
        start += size
    assert [f.index for f in frames] == list(range(6))
    pcm = np.concatenate([f.pcm for f in frames])[480:]
    assert abs(dominant_hz(pcm, 24_000) - 600) < 30
    assert 0.15 < np.max(np.abs(pcm)) / 32767 < 0.25


def test_inbound_other_rates_go_through_the_fallback_resampler() -> None:
    inbound = InboundAudio()
    frames: list[Frame] = []
    for _ in range(20):
        frame = av.AudioFrame.from_ndarray(tone(440, 320, 16_000).reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = 16_000
        frames += inbound.feed(frame)
    assert len(frames) >= 18  # libswresample holds back a few samples
    assert abs(dominant_hz(np.concatenate([f.pcm for f in frames])[960:], 24_000) - 440) < 30
