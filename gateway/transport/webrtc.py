"""aiortc glue for browser callers: one RTCPeerConnection per call, Opus on the wire, 24 kHz frames at the edge.

Owned here: the peer connection (RFC 8829 JSEP offer/answer, non-trickle: the answer is returned only once
ICE gathering is complete, so it carries every candidate, RFC 8445 §5.1.1), the agent's outbound audio track,
the task that reads the caller's decoded audio, the ``control`` data channel (RFC 8831) that carries keypad
DTMF and hang-up from the page, and clean-up. The session core is not known here: the call owner passes
``on_frame`` (one 24 kHz :class:`~telcodecs.frames.Frame` per 20 ms of caller audio) and ``pull_frame`` (the
frame the caller hears next, None for silence).

Audio paths:

* inbound — aiortc's receiver (SRTP, RTCP statistics, RTP parsing) hands each packet to
  :class:`~gateway.transport.webrtc_receive.OpusReceiveSink` in place of its jitter buffer; the sink puts it in
  order and decodes it on the loop, mono at 48 kHz, instead of aiortc's decoder thread, and
  :class:`~gateway.transport.webrtc_receive.InboundAudio` resamples it to 24 kHz frames. With
  ``decoder="aiortc"`` (or an aiortc whose receiver the sink cannot take) aiortc's jitter buffer and thread
  decode, and the remote track's ``av.AudioFrame`` s (s16 48 kHz, usually stereo) are read by a task and
  downmixed instead.
* outbound — :class:`AgentAudioTrack.recv` is awaited by aiortc's RTP sender; it is paced by absolute
  deadlines ``t0 + k * 20 ms`` on the loop clock (a ``sleep(0.02)`` loop drifts by the work done per frame),
  calls ``pull_frame`` exactly once per 20 ms of media time, upsamples 24k -> 48k and encodes the Opus packet
  itself (:class:`OutboundAudio`), which aiortc only packs into RTP. Handed a raw frame, aiortc's sender
  measures its level and encodes it in a thread-pool job per packet, with its own encoder: stereo at
  96 kbit/s and libopus' top complexity, for a mono voice: encoding here costs the worker less
  (docs/performance/2026-12-02-browser-calls.md).

ICE host candidates: aioice binds one socket per interface address and never uses 127.0.0.1. A gateway bound
to loopback (the default of ``gateway run``) must offer 127.0.0.1 or a browser on the same machine cannot
reach it without leaving loopback, so :class:`WebRtcConfig.host_addresses` chooses the addresses ICE binds.
aioice has no parameter for this; its module-level ``get_host_addresses`` is wrapped once and consults a
context variable that is set only while one of our peer connections gathers, so other aioice users in the
process are unaffected. ``advertised_host`` rewrites host candidates and ``c=`` lines in the answer for a
1:1 NAT (a cloud VM whose public address is not on an interface).

Errors::

    WebRtcError
     ├── OfferError         the browser's offer cannot be answered (malformed SDP, no Opus audio) -> 400
     └── CallRefusedError   the gateway does not take the call now (admission, limits)  -> its status
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import ipaddress
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

import av
import numpy as np
import numpy.typing as npt
from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from telcodecs.frames import FRAME_SAMPLES, SAMPLE_RATE, Frame
from telcodecs.opus import OpusEncoder
from telcodecs.resample import StreamResampler

from . import webrtc_receive
from .webrtc_receive import OPUS_RATE, WIRE_SAMPLES, InboundAudio, OpusReceiveSink

log = logging.getLogger(__name__)

FRAME_S = 0.020
MAX_OFFER_BYTES = 64 * 1024
MAX_MESSAGE_BYTES = 1024
_MAX_BEHIND_FRAMES = 5  # further behind than this (a stalled loop): re-anchor instead of bursting audio

# ------------------------------------------------------------------------------------------ errors


class WebRtcError(Exception):
    """Base of the WebRTC endpoint's errors."""


class OfferError(WebRtcError):
    """The browser's SDP offer cannot be answered; the message says why (it goes back to the client)."""


class CallRefusedError(WebRtcError):
    """The gateway does not take this call now: an HTTP-like status, a machine-readable code, a retry hint."""

    def __init__(self, status: int, code: str, message: str, *, retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True, kw_only=True)
class WebRtcAnswer:
    """What the offer endpoint returns: our SDP answer (all candidates included) and the new call's id."""

    sdp: str
    call_id: str


# ------------------------------------------------------------------------------------------ config


@dataclass(frozen=True, slots=True, kw_only=True)
class IceServer:
    """A STUN or TURN server (RFC 7064/7065 URLs) as RTCIceServer takes it."""

    urls: tuple[str, ...]
    username: str | None = None
    credential: str | None = None

    def __post_init__(self) -> None:
        if not self.urls or not all(url.startswith(("stun:", "stuns:", "turn:", "turns:")) for url in self.urls):
            raise ValueError(f"ICE server URLs must start with stun:, stuns:, turn: or turns:, got {self.urls!r}")


def parse_ice_servers(text: str) -> tuple[IceServer, ...]:
    """``GATEWAY_WEBRTC_ICE_SERVERS``: a JSON list of ``{"urls", "username", "credential"}`` objects, or a
    comma-separated list of URLs without credentials. Empty: no STUN/TURN (host candidates only)."""
    text = text.strip()
    if not text:
        return ()
    if not text.startswith("["):
        return (IceServer(urls=tuple(part.strip() for part in text.split(",") if part.strip())),)
    try:
        entries = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"ICE servers are not valid JSON: {exc}") from None
    servers = []
    for entry in entries:
        if not isinstance(entry, dict) or "urls" not in entry:
            raise ValueError(f"each ICE server needs 'urls', got {entry!r}")
        urls = entry["urls"]
        servers.append(
            IceServer(
                urls=(urls,) if isinstance(urls, str) else tuple(urls),
                username=entry.get("username"),
                credential=entry.get("credential"),
            )
        )
    return tuple(servers)


@dataclass(frozen=True, slots=True, kw_only=True)
class WebRtcConfig:
    """How the gateway's peer connections gather candidates and when they give up.

    ``host_addresses``: the local addresses ICE binds for host candidates; None means every interface
    address except loopback (aioice's own choice). ``connect_timeout_s``: from the answer until the
    connection is up. ``media_timeout_s``: no caller audio for this long on a connected call ends it (a
    closed tab that sent no DTLS close_notify would otherwise wait for ICE consent expiry, ~30 s).
    """

    ice_servers: tuple[IceServer, ...] = ()
    host_addresses: tuple[str, ...] | None = ("127.0.0.1",)
    advertised_host: str | None = None
    connect_timeout_s: float = 15.0
    media_timeout_s: float = 10.0
    gather_timeout_s: float = 10.0
    # "gateway": the agent track hands aiortc Opus packets it encoded (OutboundAudio); "aiortc": raw frames, which
    # aiortc's sender encodes itself (kept to measure against: `gateway bench webrtc`).
    encoder: Literal["gateway", "aiortc"] = "gateway"
    # "gateway": the caller's Opus is decoded on the loop as aiortc's receiver hands it over (OpusReceiveSink);
    # "aiortc": by the receiver's own decoder thread, read from its remote track (kept to measure against).
    decoder: Literal["gateway", "aiortc"] = "gateway"

    def __post_init__(self) -> None:
        for address in self.host_addresses or ():
            ipaddress.ip_address(address)
        for name in ("connect_timeout_s", "media_timeout_s", "gather_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")

    def rtc_configuration(self) -> RTCConfiguration:
        # An empty list, not None: aiortc's default configuration asks a public STUN server.
        return RTCConfiguration(
            iceServers=[
                RTCIceServer(urls=list(server.urls), username=server.username, credential=server.credential)
                for server in self.ice_servers
            ]
        )


# ------------------------------------------------------------------------------------ host addresses

_HOST_ADDRESSES: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "webrtc_host_addresses", default=None
)


def _install_host_address_hook() -> None:
    import aioice.ice as ice

    original = ice.get_host_addresses
    if getattr(original, "gateway_hook", False):
        return

    def get_host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        chosen = _HOST_ADDRESSES.get()
        if chosen is None:
            return original(use_ipv4, use_ipv6)
        out = []
        for address in chosen:
            version = ipaddress.ip_address(address).version
            if (version == 4 and use_ipv4) or (version == 6 and use_ipv6):
                out.append(address)
        return out

    get_host_addresses.gateway_hook = True  # type: ignore[attr-defined]
    ice.get_host_addresses = get_host_addresses


@contextlib.contextmanager
def ice_host_addresses(addresses: tuple[str, ...] | None) -> Iterator[None]:
    """Within this block, aiortc peer connections gather host candidates on ``addresses`` only
    (None: aioice's default, every interface but loopback)."""
    _install_host_address_hook()
    token = _HOST_ADDRESSES.set(addresses)
    try:
        yield
    finally:
        _HOST_ADDRESSES.reset(token)


# --------------------------------------------------------------------------------------------- SDP

_CANDIDATE = re.compile(r"^(a=candidate:\S+ \d+ \S+ \d+ )(\S+)( \d+ typ host.*)$")


def check_offer(sdp: str) -> None:
    """Reject an offer the answerer cannot use, with a reason the browser's developer can act on."""
    if len(sdp.encode("utf-8", "replace")) > MAX_OFFER_BYTES:
        raise OfferError(f"SDP offer is larger than {MAX_OFFER_BYTES} bytes")
    lines = [line.strip() for line in sdp.strip().splitlines()]
    if not lines or lines[0] != "v=0":
        raise OfferError("SDP offer must start with v=0")
    audio: list[str] | None = None
    sections: list[list[str]] = []
    for line in lines:
        if line.startswith("m="):
            sections.append([line])
        elif sections:
            sections[-1].append(line)
    for section in sections:
        if section[0].startswith("m=audio ") and audio is None:
            audio = section
    if audio is None:
        raise OfferError("SDP offer has no audio m-line")
    if not any(re.match(r"^a=rtpmap:\d+ opus/48000", line, re.IGNORECASE) for line in audio):
        raise OfferError("SDP offer's audio does not offer opus/48000")
    if not any(line.startswith("a=fingerprint:") for line in lines):
        raise OfferError("SDP offer has no DTLS fingerprint (a=fingerprint)")
    if not any(line.startswith("a=ice-ufrag:") for line in lines) or not any(
        line.startswith("a=ice-pwd:") for line in lines
    ):
        raise OfferError("SDP offer has no ICE credentials (a=ice-ufrag / a=ice-pwd)")


def rewrite_host_candidates(sdp: str, advertised_host: str) -> str:
    """Put ``advertised_host`` in place of the local address of every host candidate and ``c=`` line."""
    family = "IP6" if ipaddress.ip_address(advertised_host).version == 6 else "IP4"
    out = []
    for line in sdp.split("\r\n"):
        match = _CANDIDATE.match(line)
        if match:
            line = f"{match.group(1)}{advertised_host}{match.group(3)}"
        elif line.startswith("c=IN "):
            line = f"c=IN {family} {advertised_host}"
        out.append(line)
    return "\r\n".join(out)


# ------------------------------------------------------------------------------------------- audio


class OutboundAudio:
    """24 kHz agent frames (None: silence) -> one mono Opus packet per 20 ms (``av.Packet``, pts on the 48 kHz
    RTP clock), encoded as the SIP path encodes (:class:`telcodecs.opus.OpusEncoder`: voip, 32 kbit/s, in-band
    FEC, fed the session's 24 kHz as it is). The browser's decoder takes mono packets whatever channel count the
    SDP names (RFC 7587 §7)."""

    def __init__(self) -> None:
        self._encoder = OpusEncoder(channels=1, sample_rate=SAMPLE_RATE)
        self._resampler: StreamResampler | None = None  # for raw() only: aiortc's encoder takes 48 kHz
        self._silence = np.zeros(FRAME_SAMPLES, dtype=np.int16)
        self._time_base = Fraction(1, OPUS_RATE)

    def _pcm48(self, frame: Frame | None) -> npt.NDArray[np.int16]:
        # Silence goes through the resampler too, so its state stays continuous across gaps.
        if self._resampler is None:
            self._resampler = StreamResampler(SAMPLE_RATE, OPUS_RATE)
        return self._resampler.process(self._silence if frame is None else frame.pcm)

    def encode(self, frame: Frame | None, *, sequence: int) -> av.Packet:
        out = av.Packet(self._encoder.encode(self._silence if frame is None else frame.pcm))
        out.pts = sequence * WIRE_SAMPLES
        out.time_base = self._time_base
        return out

    def raw(self, frame: Frame | None, *, sequence: int) -> av.AudioFrame:
        """The same audio as an s16 mono 48 kHz frame, for aiortc's sender to encode (``encoder="aiortc"``)."""
        out = av.AudioFrame.from_ndarray(self._pcm48(frame).reshape(1, -1), format="s16", layout="mono")
        out.sample_rate = OPUS_RATE
        out.pts = sequence * WIRE_SAMPLES
        out.time_base = self._time_base
        return out


class AgentAudioTrack(MediaStreamTrack):
    """The audio the browser hears: one ``pull_frame()`` per 20 ms, paced by absolute deadlines."""

    kind = "audio"

    def __init__(self, pull_frame: Callable[[], Frame | None], *, encode: bool = True) -> None:
        super().__init__()
        self._pull = pull_frame
        self._audio = OutboundAudio()
        self._encode = encode
        self._t0: float | None = None
        self._k = 0  # frames handed to aiortc
        self.skipped = 0  # 20 ms slots dropped after a stall (re-anchoring)
        self.pull_errors = 0

    async def recv(self) -> av.Packet | av.AudioFrame:  # aiortc's sender packs an encoded packet as it is
        if self.readyState != "live":
            raise MediaStreamError
        loop = asyncio.get_running_loop()
        if self._t0 is None:
            self._t0 = loop.time()
        deadline = self._t0 + self._k * FRAME_S
        delay = deadline - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        elif -delay > _MAX_BEHIND_FRAMES * FRAME_S:
            behind = int(-delay / FRAME_S)
            self.skipped += behind
            self._t0 += behind * FRAME_S
        if self.readyState != "live":
            raise MediaStreamError
        try:
            frame = self._pull()
        except Exception:  # a bug behind the pull must not stop the RTP sender for good
            self.pull_errors += 1
            if self.pull_errors == 1:
                log.exception("pulling the agent's frame failed")
            frame = None
        # The slots a stall skipped count in the pts: the browser sees a gap in the RTP timestamps and plays what
        # follows on time, instead of every later packet arriving that much late.
        sequence = self._k + self.skipped
        self._k += 1
        if self._encode:
            return self._audio.encode(frame, sequence=sequence)
        return self._audio.raw(frame, sequence=sequence)


# -------------------------------------------------------------------------------------------- stats


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerStats:
    """What aiortc's getStats() reports for the audio stream (RTCP-derived fields are None until known)."""

    packets_in: int = 0
    packets_out: int = 0
    packets_lost: int = 0
    jitter_ms: float = 0.0
    rtt_ms: float | None = None
    remote_loss_fraction: float | None = None  # the browser's view of our stream (RTCP RR)
    bytes_in: int = 0
    bytes_out: int = 0

    @property
    def loss_pct(self) -> float:
        expected = self.packets_in + self.packets_lost
        return 100.0 * self.packets_lost / expected if expected > 0 else 0.0


def stats_from_report(report: dict[str, Any]) -> PeerStats:
    fields: dict[str, Any] = {}
    for entry in report.values():
        kind = getattr(entry, "type", "")
        if kind == "inbound-rtp":
            fields["packets_in"] = int(entry.packetsReceived)
            fields["packets_lost"] = max(0, int(entry.packetsLost))
            fields["jitter_ms"] = max(0.0, float(entry.jitter) * 1000.0 / OPUS_RATE)
        elif kind == "outbound-rtp":
            fields["packets_out"] = int(entry.packetsSent)
        elif kind == "remote-inbound-rtp":
            if entry.roundTripTime is not None:
                fields["rtt_ms"] = float(entry.roundTripTime) * 1000.0
            if entry.fractionLost is not None:
                fields["remote_loss_fraction"] = float(entry.fractionLost) / 256.0
        elif kind == "transport":
            fields["bytes_in"] = int(entry.bytesReceived)
            fields["bytes_out"] = int(entry.bytesSent)
    return PeerStats(**fields)


# --------------------------------------------------------------------------------------------- peer


class WebRtcPeer:
    """One browser call's peer connection. ``answer()`` once, ``wait_closed()`` while the call lasts,
    ``aclose()`` at the end (idempotent; it stops the inbound task and the connection)."""

    def __init__(
        self,
        config: WebRtcConfig,
        *,
        on_frame: Callable[[Frame], None],
        pull_frame: Callable[[], Frame | None],
        on_message: Callable[[dict[str, Any]], None],
        name: str = "webrtc",
    ) -> None:
        self._config = config
        self._on_frame = on_frame
        self._on_message = on_message
        self.name = name
        self.track = AgentAudioTrack(pull_frame, encode=config.encoder == "gateway")
        self._pc = RTCPeerConnection(config.rtc_configuration())
        self._inbound = InboundAudio()
        self._inbound_task: asyncio.Task[None] | None = None
        # Set in answer() when the caller's Opus is decoded as it arrives; None: read from aiortc's track.
        self.receive_sink: OpusReceiveSink | None = None
        self._channel: Any = None
        self._changed = asyncio.Event()
        self._closed = False
        self.connected_once = False
        self.frames_in = 0
        self.last_frame_at: float | None = None
        self.bad_messages = 0
        self._pending_track: MediaStreamTrack | None = None
        self._pc.on("track", self._on_track)
        self._pc.on("datachannel", self._on_datachannel)
        self._pc.on("connectionstatechange", self._changed.set)

    @property
    def connection_state(self) -> str:
        return str(self._pc.connectionState)

    async def answer(self, offer_sdp: str) -> str:
        """Apply the browser's offer and return our answer with every candidate (gathering complete)."""
        check_offer(offer_sdp)
        try:
            await self._pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        except Exception as exc:  # aiortc raises ValueError, InvalidAccessError, ... for offers it cannot take
            raise OfferError(f"SDP offer rejected: {exc or type(exc).__name__}") from None
        audio = next((t for t in self._pc.getTransceivers() if t.kind == "audio"), None)
        if audio is None:
            raise OfferError("SDP offer has no audio transceiver")
        if self._config.decoder == "gateway":
            sink = OpusReceiveSink(self._on_pcm24)
            if webrtc_receive.install(audio.receiver, sink):
                self.receive_sink = sink
            else:
                log.warning("%s: this aiortc's receiver cannot take the gateway's decoder; using its own", self.name)
        if self.receive_sink is None and self._pending_track is not None:
            self._start_inbound(self._pending_track)
        self._pending_track = None
        self._pc.addTrack(self.track)
        opus = [c for c in RTCRtpSender.getCapabilities("audio").codecs if c.mimeType.lower() == "audio/opus"]
        audio.setCodecPreferences(opus)
        answer = await self._pc.createAnswer()
        try:
            with ice_host_addresses(self._config.host_addresses):
                await asyncio.wait_for(self._pc.setLocalDescription(answer), timeout=self._config.gather_timeout_s)
        except TimeoutError:
            raise CallRefusedError(503, "ice_gathering_timeout", "ICE gathering did not complete in time") from None
        sdp = self._pc.localDescription.sdp
        if "a=candidate:" not in sdp:
            raise CallRefusedError(503, "no_ice_candidates", "the gateway has no usable ICE candidate address")
        if self._config.advertised_host:
            sdp = rewrite_host_candidates(sdp, self._config.advertised_host)
        return sdp

    # ------------------------------------------------------------------------------------- inbound

    def _on_track(self, track: MediaStreamTrack) -> None:
        # Fired inside setRemoteDescription(); answer() decides next whether the track is read at all.
        if track.kind == "audio" and self._pending_track is None:
            self._pending_track = track

    def _start_inbound(self, track: MediaStreamTrack) -> None:
        if self._inbound_task is not None or self._closed:
            return
        self._inbound_task = asyncio.get_running_loop().create_task(
            self._read_inbound(track), name=f"{self.name}-inbound"
        )

    def _on_pcm24(self, pcm: npt.NDArray[np.int16]) -> None:
        self.last_frame_at = asyncio.get_running_loop().time()
        self._deliver(self._inbound.feed_pcm24(pcm))

    def _deliver(self, frames: list[Frame]) -> None:
        for frame in frames:
            self.frames_in += 1
            try:
                self._on_frame(frame)
            except Exception:
                log.exception("%s: handling a caller frame failed", self.name)

    async def _read_inbound(self, track: MediaStreamTrack) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                decoded = await track.recv()
            except MediaStreamError:
                return
            if not isinstance(decoded, av.AudioFrame):
                continue
            self.last_frame_at = loop.time()
            self._deliver(self._inbound.feed(decoded))

    # -------------------------------------------------------------------------------- data channel

    def _on_datachannel(self, channel: Any) -> None:
        if channel.label != "control":
            return
        self._channel = channel
        channel.on("message", self._on_channel_message)

    def _on_channel_message(self, message: str | bytes) -> None:
        try:
            if len(message) > MAX_MESSAGE_BYTES:
                raise ValueError("message too long")
            data = json.loads(message)
            if not isinstance(data, dict) or not isinstance(data.get("type"), str):
                raise ValueError("not an object with a 'type'")
        except ValueError as exc:
            self.bad_messages += 1
            log.debug("%s: ignored data channel message: %s", self.name, exc)
            return
        try:
            self._on_message(data)
        except Exception:
            log.exception("%s: handling a data channel message failed", self.name)

    def send_message(self, message: dict[str, Any]) -> bool:
        """Send a JSON message to the page on the control channel; False when it is not open."""
        channel = self._channel
        if channel is None or channel.readyState != "open":
            return False
        try:
            channel.send(json.dumps(message))
        except Exception as exc:  # the SCTP association may be going away
            log.debug("%s: data channel send failed: %s", self.name, exc)
            return False
        return True

    # ----------------------------------------------------------------------------------- lifecycle

    async def wait_closed(self, on_connected: Callable[[], None] | None = None) -> str:
        """Watch the connection until it ends; returns why: ``ice_timeout`` (never connected in time),
        ``ice_failed``, ``peer_closed`` (DTLS close / our own close) or ``media_timeout``."""
        loop = asyncio.get_running_loop()
        config = self._config
        connect_deadline = loop.time() + config.connect_timeout_s
        while True:
            self._changed.clear()
            state = self._pc.connectionState
            if state == "failed":
                return "ice_failed"
            if state == "closed" or self._closed:
                return "peer_closed"
            now = loop.time()
            if state == "connected" and not self.connected_once:
                self.connected_once = True
                self.last_frame_at = self.last_frame_at or now
                if on_connected is not None:
                    on_connected()
            if self.connected_once:
                assert self.last_frame_at is not None
                silent_for = now - self.last_frame_at
                if silent_for > config.media_timeout_s:
                    return "media_timeout"
                wait = min(1.0, config.media_timeout_s - silent_for + 0.05)
            else:
                if now >= connect_deadline:
                    return "ice_timeout"
                wait = connect_deadline - now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=wait)

    async def stats(self) -> PeerStats:
        if self._closed:
            return PeerStats()
        try:
            return stats_from_report(await self._pc.getStats())
        except Exception as exc:  # a transport torn down under us
            log.debug("%s: getStats failed: %s", self.name, exc)
            return PeerStats()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._changed.set()
        self.track.stop()
        try:
            await asyncio.wait_for(self._pc.close(), timeout=5.0)
        except TimeoutError:
            log.warning("%s: closing the peer connection timed out", self.name)
        task = self._inbound_task
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
