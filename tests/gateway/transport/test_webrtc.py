"""aiortc glue: audio conversion both ways, the paced agent track, SDP checks, and two aiortc peers in-process.

The in-process call uses a Python aiortc client (the browser's role) that offers Opus with an audio track of
generated speech-like audio, against :class:`WebRtcPeer` whose ``pull_frame`` plays back what ``on_frame``
delivered (a loop at the 24 kHz frame edge). What the client hears must correlate with what it sent.
The client helpers here are shared with the worker's WebRTC tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Literal

import av
import numpy as np
import numpy.typing as npt
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from scipy import signal

from bench.webrtc import PlaybackTrack
from gateway.loadtest.analysis import echo_correlation as echo_correlation_at
from gateway.transport.webrtc import (
    AgentAudioTrack,
    IceServer,
    OfferError,
    OutboundAudio,
    PeerStats,
    WebRtcConfig,
    WebRtcPeer,
    check_offer,
    ice_host_addresses,
    parse_ice_servers,
    rewrite_host_candidates,
    stats_from_report,
)
from gateway.transport.webrtc_receive import downmix_s16
from telcodecs.frames import FRAME_SAMPLES, Frame
from telcodecs.opus import OpusDecoder
from telcodecs.resample import StreamResampler
from tests.support.audio import align_and_correlate

RATE = 48_000

# ------------------------------------------------------------------------------------ test audio


def speech_like(seconds: float, rate: int = RATE, *, seed: int = 7) -> npt.NDArray[np.int16]:
    """Voiced 'syllables': a gliding pitch with formant-weighted harmonics, 4 Hz envelope, short pauses."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    t = np.arange(n) / rate
    f0 = 150 + 50 * np.sin(2 * np.pi * 0.7 * t) + 20 * np.sin(2 * np.pi * 2.3 * t + 1.0)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    voice = np.zeros(n)
    for k in range(1, 25):
        weight = np.exp(-(((k * 170) - 500) ** 2) / 2e5) + 0.6 * np.exp(-(((k * 170) - 1500) ** 2) / 4e5) + 0.05
        voice += weight * np.sin(k * phase + rng.uniform(0, 2 * np.pi))
    envelope = np.clip(np.sin(2 * np.pi * 4.0 * t + rng.uniform(0, 6)), 0, None) ** 0.7
    pauses = (np.sin(2 * np.pi * 0.45 * t) > -0.6).astype(float)
    signal = voice * envelope * pauses + 0.01 * rng.standard_normal(n)
    return (signal / np.max(np.abs(signal)) * 0.5 * 32767).astype(np.int16)


def tone(freq: float, samples: int, rate: int, amplitude: float = 0.3) -> npt.NDArray[np.int16]:
    return (amplitude * 32767 * np.sin(2 * np.pi * freq * np.arange(samples) / rate)).astype(np.int16)


def dominant_hz(pcm: npt.NDArray[np.int16], rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(pcm.astype(np.float64) * np.hanning(pcm.size)))
    return float(np.argmax(spectrum) * rate / pcm.size)


# ------------------------------------------------------------------------------- browser stand-in


@dataclass
class BrowserStandIn:
    """A Python aiortc peer in the browser's role: offers Opus + a 'control' data channel, records what it hears."""

    pc: RTCPeerConnection
    track: PlaybackTrack
    channel: Any
    heard: list[npt.NDArray[np.int16]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None
    channel_open: asyncio.Event = field(default_factory=asyncio.Event)
    got_message: asyncio.Event = field(default_factory=asyncio.Event)
    got_audio: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def heard_seconds(self) -> float:
        return sum(piece.size for piece in self.heard) / RATE

    def heard_audio(self) -> npt.NDArray[np.int16]:
        return np.concatenate(self.heard) if self.heard else np.zeros(0, dtype=np.int16)

    async def offer(self) -> str:
        with ice_host_addresses(("127.0.0.1",)):
            await self.pc.setLocalDescription(await self.pc.createOffer())
        return str(self.pc.localDescription.sdp)

    async def accept(self, answer_sdp: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer_sdp, type="answer"))

    def send(self, message: dict[str, Any]) -> None:
        self.channel.send(json.dumps(message))

    async def wait_heard(self, seconds: float, *, within: float) -> None:
        async with asyncio.timeout(within):
            while True:
                self.got_audio.clear()
                if self.heard_seconds >= seconds:
                    return
                await self.got_audio.wait()

    async def wait_message(self, kind: str, *, within: float) -> dict[str, Any]:
        async with asyncio.timeout(within):
            while True:
                for message in self.messages:
                    if message.get("type") == kind:
                        return message
                self.got_message.clear()
                await self.got_message.wait()


@contextlib.asynccontextmanager
async def browser_stand_in(samples: npt.NDArray[np.int16]) -> AsyncIterator[BrowserStandIn]:
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    track = PlaybackTrack(samples)
    pc.addTrack(track)
    channel = pc.createDataChannel("control")
    client = BrowserStandIn(pc=pc, track=track, channel=channel)
    channel.on("open", client.channel_open.set)

    def on_message(message: str) -> None:
        client.messages.append(json.loads(message))
        client.got_message.set()

    channel.on("message", on_message)

    async def read(remote: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                client.heard.append(downmix_s16(await remote.recv()))
                client.got_audio.set()

    def on_track(remote: MediaStreamTrack) -> None:
        if remote.kind == "audio" and client.reader is None:
            client.reader = asyncio.get_running_loop().create_task(read(remote), name="stand-in-reader")

    pc.on("track", on_track)
    try:
        yield client
    finally:
        track.stop()
        await asyncio.wait_for(pc.close(), timeout=5)
        if client.reader is not None:
            client.reader.cancel()
            await asyncio.gather(client.reader, return_exceptions=True)


def echo_correlation(sent: npt.NDArray[np.int16], heard: npt.NDArray[np.int16]) -> tuple[float, int]:
    """Each 250 ms window of what was sent, found up to 250 ms from where the one before it was: a loop paced
    without a jitter buffer plays silence for as long as the process was stalled (a loaded CI machine stalls it
    for 80 ms and more), and everything after is that much later."""
    return align_and_correlate(
        sent.astype(np.float64), heard.astype(np.float64), RATE, max_lag_seconds=1.5, max_slip_seconds=0.25
    )


async def run_echo_call(
    answer: Callable[[str], Awaitable[str]], sent: npt.NDArray[np.int16], *, listen_s: float
) -> BrowserStandIn:
    """Offer, take the answer from `answer`, play `sent` and keep what comes back for `listen_s` seconds."""
    async with browser_stand_in(sent) as client:
        await client.accept(await answer(await client.offer()))
        await client.wait_heard(listen_s, within=listen_s + 15)
        return client


# -------------------------------------------------------------------------------------- the tests


def _decoded(packets: list[av.Packet]) -> npt.NDArray[np.int16]:
    decoder = OpusDecoder(channels_out=1)
    return np.concatenate([decoder.decode(bytes(packet)) for packet in packets])


def test_outbound_encodes_one_mono_opus_packet_per_frame_with_consecutive_pts() -> None:
    outbound = OutboundAudio()
    pcm = tone(800, FRAME_SAMPLES * 10, 24_000)
    packets = [outbound.encode(Frame(index=i, pcm=pcm[i * 480 : (i + 1) * 480]), sequence=i) for i in range(10)]
    for i, packet in enumerate(packets):
        assert packet.pts == i * 960 and packet.time_base == Fraction(1, RATE)
        assert 0 < packet.size < 200  # 20 ms at 32 kbit/s (+ FEC) is about 80 bytes
        assert bytes(packet)[0] & 0x04 == 0  # TOC byte: mono (RFC 6716 §3.1)
    wire = _decoded(packets)
    assert wire.size == 10 * 960
    assert abs(dominant_hz(wire[1920:], RATE) - 800) < 30
    quiet = [outbound.encode(None, sequence=10 + i) for i in range(10)]
    assert [p.pts for p in quiet] == [(10 + i) * 960 for i in range(10)]
    assert np.abs(_decoded(packets + quiet)[-960:]).max() < 50  # silence, after the codec's tail


def test_outbound_raw_frames_for_aiortc_to_encode_are_the_same_audio_at_48k() -> None:
    raw, resampler = OutboundAudio(), StreamResampler(24_000, RATE)
    pcm = tone(800, FRAME_SAMPLES * 5, 24_000)
    frames = [raw.raw(Frame(index=i, pcm=pcm[i * 480 : (i + 1) * 480]), sequence=i) for i in range(5)]
    for i, frame in enumerate(frames):
        assert (frame.sample_rate, frame.format.name, frame.layout.name, frame.samples) == (RATE, "s16", "mono", 960)
        assert frame.pts == i * 960
    wire = np.concatenate([f.to_ndarray().reshape(-1) for f in frames])
    assert np.array_equal(wire, np.concatenate([resampler.process(pcm[i * 480 : (i + 1) * 480]) for i in range(5)]))
    assert abs(dominant_hz(wire[960:], RATE) - 800) < 30


async def test_agent_track_pulls_once_per_20ms_at_absolute_deadlines() -> None:
    pulls: list[float] = []
    loop = asyncio.get_running_loop()

    def pull() -> Frame | None:
        pulls.append(loop.time())
        return None

    track = AgentAudioTrack(pull)
    first = await track.recv()
    for _ in range(49):
        await track.recv()
    elapsed = pulls[-1] - pulls[0]
    assert len(pulls) == 50
    assert all(t - pulls[0] >= i * 0.02 - 0.002 for i, t in enumerate(pulls))  # never early
    assert elapsed <= 0.98 + 0.1, elapsed  # 49 intervals of 20 ms, no drift accumulated per frame
    assert first.pts == 0
    # A stall longer than the catch-up window re-anchors: later frames are paced again, not burst.
    await asyncio.sleep(0.3)
    before = len(pulls)
    stamps = [(await track.recv()).pts for _ in range(10)]
    assert len(pulls) == before + 10
    assert track.skipped >= 10
    assert pulls[-1] - pulls[before] >= 0.17
    # The skipped slots show as a gap in the pts (the RTP timestamps), so later audio is not that much late.
    assert stamps[-1] == (50 + 9 + track.skipped) * 960
    track.stop()
    with pytest.raises(MediaStreamError):
        await track.recv()


async def test_agent_track_survives_a_failing_pull() -> None:
    calls = 0

    def pull() -> Frame | None:
        nonlocal calls
        calls += 1
        raise RuntimeError("boom")

    track = AgentAudioTrack(pull)
    packets = [await track.recv() for _ in range(5)]
    assert calls == 5 and track.pull_errors == 5
    assert np.abs(_decoded(packets)).max() < 50  # silence goes out in place of what could not be pulled
    track.stop()


async def _aiortc_offer() -> str:
    async with browser_stand_in(np.zeros(960, dtype=np.int16)) as client:
        return await client.offer()


async def test_check_offer_accepts_aiortc_and_names_what_is_wrong() -> None:
    offer = await _aiortc_offer()
    check_offer(offer)
    assert "a=candidate:" in offer and " 127.0.0.1 " in offer
    cases = {
        "must start with v=0": offer.replace("v=0", "v=1", 1),
        "no audio m-line": offer.replace("m=audio", "m=video"),
        "does not offer opus": offer.replace("opus/48000", "speex/48000"),
        "no DTLS fingerprint": "\r\n".join(
            line for line in offer.split("\r\n") if not line.startswith("a=fingerprint")
        ),
        "no ICE credentials": "\r\n".join(line for line in offer.split("\r\n") if not line.startswith("a=ice-pwd")),
        "larger than": offer + "a=x-pad:" + "x" * 70_000 + "\r\n",
    }
    for reason, sdp in cases.items():
        with pytest.raises(OfferError, match=reason):
            check_offer(sdp)


def test_rewrite_host_candidates_for_an_advertised_address() -> None:
    sdp = "\r\n".join(
        [
            "v=0",
            "c=IN IP4 127.0.0.1",
            "a=candidate:abc 1 udp 2130706431 127.0.0.1 40000 typ host",
            "a=candidate:def 1 udp 1694498815 198.51.100.7 40000 typ srflx raddr 127.0.0.1 rport 40000",
            "",
        ]
    )
    out = rewrite_host_candidates(sdp, "203.0.113.9").split("\r\n")
    assert out[1] == "c=IN IP4 203.0.113.9"
    assert out[2] == "a=candidate:abc 1 udp 2130706431 203.0.113.9 40000 typ host"
    assert out[3].startswith("a=candidate:def 1 udp 1694498815 198.51.100.7 ")


def test_ice_server_settings() -> None:
    assert parse_ice_servers("") == ()
    assert parse_ice_servers("stun:stun.example.org:3478, stun:10.0.0.1") == (
        IceServer(urls=("stun:stun.example.org:3478", "stun:10.0.0.1")),
    )
    servers = parse_ice_servers('[{"urls": "turn:turn.example.org", "username": "u", "credential": "p"}]')
    assert servers == (IceServer(urls=("turn:turn.example.org",), username="u", credential="p"),)
    config = WebRtcConfig(ice_servers=servers).rtc_configuration()
    assert config.iceServers is not None and config.iceServers[0].username == "u"
    assert WebRtcConfig().rtc_configuration().iceServers == []  # never aiortc's public STUN default
    for bad in ("[{", '[{"username": "u"}]', "http://x"):
        with pytest.raises(ValueError):
            parse_ice_servers(bad)


def test_stats_from_an_aiortc_report() -> None:
    class Entry:
        def __init__(self, **kw: Any) -> None:
            self.__dict__.update(kw)

    report = {
        "a": Entry(type="inbound-rtp", packetsReceived=90, packetsLost=10, jitter=480),
        "b": Entry(type="outbound-rtp", packetsSent=120),
        "c": Entry(type="remote-inbound-rtp", roundTripTime=0.05, fractionLost=64),
        "d": Entry(type="transport", bytesReceived=1000, bytesSent=2000),
    }
    stats = stats_from_report(report)
    assert stats == PeerStats(
        packets_in=90,
        packets_out=120,
        packets_lost=10,
        jitter_ms=10.0,
        rtt_ms=50.0,
        remote_loss_fraction=0.25,
        bytes_in=1000,
        bytes_out=2000,
    )
    assert stats.loss_pct == pytest.approx(10.0)


@pytest.mark.parametrize(("encoder", "decoder"), [("gateway", "gateway"), ("aiortc", "gateway"), ("gateway", "aiortc")])
async def test_two_aiortc_peers_loop_audio_at_the_24k_frame_edge(
    encoder: Literal["gateway", "aiortc"], decoder: Literal["gateway", "aiortc"]
) -> None:
    """Opus in -> 24 kHz frames -> (looped back) -> paced track -> Opus out: the client hears itself, with the
    agent's Opus encoded by the track or by aiortc's sender, and the caller's decoded on the loop or by aiortc's
    decoder thread."""
    sent = speech_like(4.0)
    looped: deque[Frame] = deque(maxlen=50)
    received: list[Frame] = []
    messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def on_frame(frame: Frame) -> None:
        received.append(frame)
        looped.append(frame)

    peer = WebRtcPeer(
        WebRtcConfig(connect_timeout_s=10, encoder=encoder, decoder=decoder),
        on_frame=on_frame,
        pull_frame=lambda: looped.popleft() if looped else None,
        on_message=messages.put_nowait,
        name="test-peer",
    )
    connected = asyncio.Event()
    watch = asyncio.create_task(peer.wait_closed(on_connected=connected.set))
    try:
        async with browser_stand_in(sent) as client:
            answer = await peer.answer(await client.offer())
            assert "a=candidate:" in answer and " 127.0.0.1 " in answer
            assert "opus/48000" in answer
            await client.accept(answer)
            await asyncio.wait_for(connected.wait(), timeout=10)
            await asyncio.wait_for(client.channel_open.wait(), timeout=10)
            client.send({"type": "dtmf", "digit": "5"})
            client.send({"no": "type"})
            await client.wait_heard(5.0, within=20)
            receiver = next(t.receiver for t in peer._pc.getTransceivers() if t.kind == "audio")
            decoder_running = receiver._RTCRtpReceiver__decoder_thread.is_alive()
            first = await asyncio.wait_for(messages.get(), timeout=5)
            stats = await peer.stats()
            assert peer.send_message({"type": "ended", "reason": "test"})
            await client.wait_message("ended", within=5)
        assert first == {"type": "dtmf", "digit": "5"} and messages.empty()
        assert peer.bad_messages == 1
        assert [f.index for f in received] == list(range(len(received)))
        assert len(received) >= 200
        if decoder == "gateway":  # decoded on the loop: aiortc's decoder thread ended as it started
            assert peer.receive_sink is not None and peer.receive_sink.frames >= 200
            assert not decoder_running
        else:
            assert peer.receive_sink is None and decoder_running
        correlation, lag = echo_correlation(sent, client.heard_audio())
        print(f"loop correlation {correlation:.3f} at lag {lag / RATE * 1000:.0f} ms")
        assert correlation > 0.75, (correlation, lag)
        assert 0 < lag < RATE  # played back within a second
        assert stats.packets_in >= 150 and stats.packets_out >= 150
        # The client closed: DTLS close_notify ends the call on our side.
        reason = await asyncio.wait_for(watch, timeout=10)
        assert reason in ("peer_closed", "ice_failed")
    finally:
        await peer.aclose()
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    assert peer.connection_state == "closed"


def _segment_lag(sent24: npt.NDArray[np.int16], received: npt.NDArray[np.int16], start_s: float) -> int:
    """Where 1.5 s of what was sent (at 24 kHz), from ``start_s``, is in what the session got, minus where it
    was sent (samples)."""
    start = int(start_s * 24_000)
    piece = sent24[start : start + 36_000]
    found = echo_correlation_at(piece, received[start:], max_lag=12_000)
    assert found.correlation > 0.8, found
    return found.lag


async def test_after_a_lost_packet_the_caller_is_heard_no_later_than_before() -> None:
    """aiortc's jitter buffer, after one lost packet, kept the caller's audio 14 packets (280 ms) behind for
    the rest of the call; the gateway's receive path conceals the frame and catches up.

    Measured on the frames the session gets, against when each packet was sent: an echo back to the caller
    would also carry every stall of this process's loop as silence in what the caller hears."""
    sent = speech_like(6.0)
    loop = asyncio.get_running_loop()
    sent_at: list[float] = []  # RTP packet n left the caller at sent_at[n]
    got: list[tuple[float, Frame]] = []
    enough = asyncio.Event()

    def on_frame(frame: Frame) -> None:
        got.append((loop.time(), frame))
        if len(got) >= 290:
            enough.set()

    peer = WebRtcPeer(
        WebRtcConfig(connect_timeout_s=10),
        on_frame=on_frame,
        pull_frame=lambda: None,
        on_message=lambda message: None,
        name="lossy",
    )
    try:
        async with browser_stand_in(sent) as client:
            transport = client.pc.getSenders()[0].transport
            send_rtp = transport._send_rtp

            async def lose_the_150th(data: bytes) -> None:  # 3 s in: one Opus packet never arrives
                if not 192 <= data[1] <= 223:  # RTP, not RTCP (RFC 5761 §4)
                    sent_at.append(loop.time())
                    if len(sent_at) == 150:
                        return
                await send_rtp(data)

            transport._send_rtp = lose_the_150th
            await client.accept(await peer.answer(await client.offer()))
            await asyncio.wait_for(enough.wait(), timeout=25)
        sink = peer.receive_sink
        assert sink is not None and sink.concealed == 1 and sink.late == 0
        # On the caller's timeline: the lost 20 ms is filled in, so what follows is where it was sent.
        assert [frame.index for _, frame in got] == list(range(len(got)))
        received = np.concatenate([frame.pcm for _, frame in got])
        sent24 = signal.resample_poly(sent, 1, 2).astype(np.int16)
        before, after = _segment_lag(sent24, received, 1.0), _segment_lag(sent24, received, 4.0)
        assert abs(after - before) <= 24, (before, after)  # 1 ms; a frame skipped would be 480
        # And no later: each frame's delay from its packet leaving the caller, before the loss and after it.
        # The hole waits 40 ms for the packet, then the frames behind it go at once; by 3.4 s all is caught up.
        delays = [at - sent_at[n] for n, (at, _) in enumerate(got) if n < len(sent_at)]
        delay_before = float(np.median(delays[50:145]))
        delay_after = float(np.median(delays[170:285]))
        print(f"delay before the loss {delay_before * 1000:.1f} ms, after {delay_after * 1000:.1f} ms")
        assert delay_after - delay_before < 0.02, (delay_before, delay_after)
    finally:
        await peer.aclose()


async def test_a_peer_that_never_connects_times_out_and_closes_cleanly() -> None:
    peer = WebRtcPeer(
        WebRtcConfig(connect_timeout_s=0.5),
        on_frame=lambda frame: None,
        pull_frame=lambda: None,
        on_message=lambda message: None,
        name="lonely",
    )
    answer = await peer.answer(await _aiortc_offer())  # the offerer is gone before it could connect
    assert "a=candidate:" in answer
    assert await asyncio.wait_for(peer.wait_closed(), timeout=5) in ("ice_timeout", "ice_failed")
    await peer.aclose()
    await peer.aclose()  # idempotent
    assert peer.connection_state == "closed"
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith("lonely")]
