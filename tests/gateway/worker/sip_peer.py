"""A scripted SIP phone for worker tests: our own sans-I/O SipEndpoint + SipTransport + an RTP socket.

It places calls to a worker on loopback, streams a G.711 (or Opus) signal at 20 ms, records what comes back, and
exposes the SIP events it saw through an asyncio queue, so tests wait for events with deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from gateway.media.rtp import build_rtp, parse_rtp
from gateway.media.srtp import SrtpConfig, SrtpContext, SrtpError
from gateway.sip.config import SipConfig
from gateway.sip.endpoint import SipEndpoint
from gateway.sip.errors import RemoteProtocolError
from gateway.sip.events import CallHandle, CallOffered, SipEvent
from gateway.sip.message import SipRequest, SipResponse, parse_message
from gateway.sip.sdes import (
    CryptoAttribute,
    KeyParam,
    SrtpRefused,
    crypto_lines,
    read_answer,
    secure_offer,
    with_crypto,
)
from gateway.sip.sdp import RTP_PROFILES, SRTP_PROFILES, LocalMedia, build_answer, build_offer, negotiate, parse_sdp
from gateway.transport.sip_transport import SipTransport
from gateway.transport.tls import TlsContexts
from telcodecs.g711 import alaw_decode, alaw_encode, ulaw_decode, ulaw_encode
from telcodecs.opus import OpusDecoder, OpusEncoder

if TYPE_CHECKING:
    from gateway.sip.auth import ClientCredentials
    from gateway.worker.worker import MediaWorker


@dataclass
class PeerCall:
    handle: CallHandle
    rtp: socket.socket
    codec: str = "PCMU"
    payload_type: int = 0
    remote_rtp: tuple[str, int] | None = None
    received: list[bytes] = field(default_factory=list)
    received_pts: list[int] = field(default_factory=list)
    received_seqs: list[int] = field(default_factory=list)
    received_timestamps: list[int] = field(default_factory=list)
    opus_encoder: OpusEncoder | None = None
    # SRTP (SDES): the crypto lines we offered, and once answered the context both ways; datagrams it refused.
    offered_crypto: tuple[CryptoAttribute, ...] = ()
    srtp: SrtpContext | None = None
    srtp_refused: list[str] = field(default_factory=list)
    # Datagrams that came before the answer was read (the gateway sends RTP as soon as it answers): held until
    # the answer says whether they are SRTP and with which key.
    early: list[bytes] = field(default_factory=list)
    frames_sent: int = 0
    last_sent: bytes | None = None  # the last datagram stream() sent


class SipPeer:
    def __init__(
        self,
        *,
        port: int | None = None,
        authenticator: object | None = None,
        tls: TlsContexts | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        """``tls``: also speak SIP over TLS (a listener on ``tls_port`` when the contexts carry a certificate);
        ``host``: another loopback address (127.0.0.2: a second trunk's source)."""
        from tests.support.procs import free_ports

        if port is None:
            port = free_ports(1)[0]
        self.tls_port = free_ports(1)[0]
        transports = ("udp", "tls") if tls is not None else ("udp",)
        self.host = host
        config = SipConfig(
            local_host=host,
            local_port=port,
            tls_port=self.tls_port,
            transports=transports,
            rate_limit=None,
            authenticator=authenticator,  # type: ignore[arg-type]
        )
        self.endpoint = SipEndpoint(config, rng=random.Random(7))
        self.requests: list[SipRequest] = []  # every request the worker sent us, for checks of its headers
        self.responses: list[SipResponse] = []  # and every response, likewise
        receive = self.endpoint.receive

        def recording_receive(data: bytes, source: tuple[str, int], *, transport: str, now: float) -> None:
            with contextlib.suppress(RemoteProtocolError):
                message = parse_message(data)
                if isinstance(message, SipRequest):
                    self.requests.append(message)
                else:
                    self.responses.append(message)
            receive(data, source, transport=transport, now=now)

        self.endpoint.receive = recording_receive  # type: ignore[method-assign]
        self.events: asyncio.Queue[SipEvent] = asyncio.Queue()
        self.transport = SipTransport(
            self.endpoint,
            host=host,
            port=port,
            transports=transports,
            on_events=self._on_events,
            tls=tls,
            tls_port=self.tls_port,
        )
        self.calls: dict[CallHandle, PeerCall] = {}

    def _on_events(self, events: list[SipEvent]) -> None:
        for event in events:
            self.events.put_nowait(event)

    async def __aenter__(self) -> SipPeer:
        await self.transport.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        for call in self.calls.values():
            asyncio.get_running_loop().remove_reader(call.rtp.fileno())
            call.rtp.close()
        await self.transport.aclose()

    @property
    def port(self) -> int:
        return self.transport.port

    async def wait_for(self, kind: type, *, within: float = 5.0, call: CallHandle | None = None) -> SipEvent:
        async def next_match() -> SipEvent:
            while True:
                event = await self.events.get()
                if isinstance(event, kind) and (call is None or getattr(event, "call", None) == call):
                    return event

        return await asyncio.wait_for(next_match(), timeout=within)

    def invite(
        self,
        target: str,
        *,
        codecs: Sequence[str] = ("PCMU",),
        body: bytes | None = None,
        from_user: str = "+15550100",
        srtp: Sequence[str] = (),
        srtp_profile: str = "RTP/SAVP",
        telephone_event: bool = True,
        credentials: ClientCredentials | None = None,
    ) -> PeerCall:
        """``srtp``: offer these SDES suites (one a=crypto line each, tags 1..) on ``srtp_profile`` (RTP/AVP for an
        RFC 8643 OSRTP offer); ``credentials`` answer a 401."""
        rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rtp.bind((self.host, 0))
        rtp.setblocking(False)
        offered = tuple(
            CryptoAttribute(tag=tag, suite=suite, keys=(KeyParam(key_salt=random.randbytes(30)),))
            for tag, suite in enumerate(srtp, start=1)
        )
        if body is None:
            offer = build_offer(
                local_address=self.host,
                local_port=rtp.getsockname()[1],
                session_id=1,
                session_version=1,
                preferences=tuple(codecs),
                telephone_event=telephone_event,
            )
            mode = "required" if srtp_profile.upper() in SRTP_PROFILES else "optional"
            body = secure_offer(offer, mode, offered).to_bytes()
        handle = self.endpoint.invite(
            target,
            self.transport.now(),
            from_uri=f"sip:{from_user}@{self.host}:{self.port}",
            body=body,
            credentials=credentials,
        )
        call = PeerCall(handle=handle, rtp=rtp, offered_crypto=offered)
        self.calls[handle] = call
        self._read_rtp(call)
        self.transport.pump()
        return call

    def _read_rtp(self, call: PeerCall) -> None:
        def on_rtp() -> None:
            while True:
                try:
                    data = call.rtp.recv(2048)
                except BlockingIOError:
                    return
                if call.offered_crypto and call.remote_rtp is None:
                    call.early.append(data)
                else:
                    self._take_rtp(call, data)

        asyncio.get_running_loop().add_reader(call.rtp.fileno(), on_rtp)

    @staticmethod
    def _take_rtp(call: PeerCall, data: bytes) -> None:
        if call.srtp is not None:
            try:
                data = call.srtp.unprotect(data)
            except SrtpError as exc:
                call.srtp_refused.append(exc.reason)
                return
        packet = parse_rtp(data)
        call.received_pts.append(packet.payload_type)
        call.received_seqs.append(packet.sequence_number)
        call.received_timestamps.append(packet.timestamp)
        call.received.append(packet.payload)

    def answer(self, offered: CallOffered, *, srtp_tag: int | None = None) -> PeerCall:
        """Answer an incoming call (we are the trunk / callee) with PCMU and an RTP socket of our own; with
        ``srtp_tag``, accept that a=crypto line of the offer with a key of ours (SRTP both ways)."""
        rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        rtp.bind(("127.0.0.1", 0))
        rtp.setblocking(False)
        offer = parse_sdp(offered.body)
        negotiated = negotiate(offer, local=LocalMedia(), profiles=RTP_PROFILES | SRTP_PROFILES)
        answer = build_answer(
            offer,
            negotiated,
            local_address="127.0.0.1",
            local_port=rtp.getsockname()[1],
            session_id=2,
            session_version=1,
        )
        context = None
        if srtp_tag is not None:
            lines = [p for _, p in crypto_lines(offer.media[negotiated.media_index]) if isinstance(p, CryptoAttribute)]
            theirs = next(line for line in lines if line.tag == srtp_tag)
            ours = CryptoAttribute(tag=srtp_tag, suite=theirs.suite, keys=(KeyParam(key_salt=random.randbytes(30)),))
            answer = with_crypto(answer, negotiated.media_index, (ours.to_attribute(),))
            context = SrtpContext(
                SrtpConfig(suite=theirs.suite, local_key=ours.keys[0].key_salt, remote_key=theirs.keys[0].key_salt)
            )
        call = PeerCall(
            handle=offered.call,
            rtp=rtp,
            codec=negotiated.codec_name,
            payload_type=negotiated.payload_type,
            srtp=context,
        )
        call.remote_rtp = negotiated.remote_rtp
        self.calls[offered.call] = call
        self._read_rtp(call)
        self.endpoint.answer(offered.call, self.transport.now(), body=answer.to_bytes())
        self.transport.pump()
        return call

    def answered(self, call: PeerCall, answer_body: bytes) -> None:
        answer = parse_sdp(answer_body)
        negotiated = negotiate(answer, local=LocalMedia(), profiles=RTP_PROFILES | SRTP_PROFILES)
        call.codec = negotiated.codec_name
        call.payload_type = negotiated.payload_type
        call.remote_rtp = negotiated.remote_rtp
        if call.offered_crypto:
            # The gateway's answer to our SRTP offer: exactly one of our lines, with its own key (RFC 4568 §5.1.2).
            try:
                srtp = read_answer(answer, negotiated, call.offered_crypto, "optional")
            except SrtpRefused as exc:
                raise AssertionError(f"the gateway's SRTP answer is not acceptable: {exc}") from exc
            if srtp is not None:
                call.srtp = SrtpContext(
                    SrtpConfig(suite=srtp.suite, local_key=srtp.local_key, remote_key=srtp.remote_key)
                )
        early, call.early = call.early, []
        for data in early:
            self._take_rtp(call, data)

    def rekey(self, call: PeerCall, new_key: bytes) -> bytes:
        """A re-offer with a new key of ours on the accepted line (RFC 4568 §7.1.4); returns the body sent."""
        assert call.srtp is not None and call.remote_rtp is not None
        offer = build_offer(
            local_address="127.0.0.1",
            local_port=call.rtp.getsockname()[1],
            session_id=1,
            session_version=2,
            preferences=(call.codec,),
        )
        line = CryptoAttribute(tag=1, suite=call.srtp.suite, keys=(KeyParam(key_salt=new_key),))
        body = secure_offer(offer, "required", (line,)).to_bytes()
        call.offered_crypto = (line,)
        self.endpoint.reinvite(call.handle, self.transport.now(), body=body)
        self.transport.pump()
        return body

    def rekeyed(self, call: PeerCall, answer_body: bytes) -> None:
        """The answer to :meth:`rekey`: our sending context takes the new key; the gateway's (it keeps its key,
        so its outbound context carries on) is read from the answer."""
        assert call.srtp is not None
        answer = parse_sdp(answer_body)
        [(_, line)] = crypto_lines(answer.media[0])
        assert isinstance(line, CryptoAttribute)
        old = call.srtp.config
        call.srtp.rekey(
            SrtpConfig(
                suite=old.suite, local_key=call.offered_crypto[0].keys[0].key_salt, remote_key=line.keys[0].key_salt
            )
        )

    def send_raw(self, call: PeerCall, data: bytes) -> None:
        """One datagram to the gateway's RTP port as it is (a plain packet into an SRTP call, a tampered one)."""
        assert call.remote_rtp is not None
        call.rtp.sendto(data, call.remote_rtp)

    def hang_up(self, call: PeerCall) -> None:
        self.endpoint.hang_up(call.handle, self.transport.now())
        self.transport.pump()

    async def stream(self, call: PeerCall, pcm8k: np.ndarray, *, frames: int | None = None) -> None:
        """Send ``pcm8k`` as 20 ms G.711 packets (Opus: libopus fed the 8 kHz signal), paced on absolute deadlines."""
        assert call.remote_rtp is not None
        if call.codec == "opus":
            if call.opus_encoder is None:
                call.opus_encoder = OpusEncoder(sample_rate=8000)
            encode = call.opus_encoder.encode
            ticks = 960  # the RTP clock is 48 kHz whatever the audio's rate (RFC 7587)
        else:
            encode = ulaw_encode if call.codec == "PCMU" else alaw_encode
            ticks = 160
        loop = asyncio.get_running_loop()
        count = frames if frames is not None else len(pcm8k) // 160
        start = loop.time()
        for i in range(count):
            chunk = pcm8k[i * 160 : (i + 1) * 160]
            if chunk.size < 160:
                chunk = np.pad(chunk, (0, 160 - chunk.size))
            packet = build_rtp(
                payload_type=call.payload_type,
                sequence_number=(1000 + call.frames_sent) & 0xFFFF,
                timestamp=ticks * call.frames_sent,
                ssrc=0x1234,
                payload=encode(chunk.astype(np.int16)),
                marker=i == 0,
            )
            if call.srtp is not None:
                packet = call.srtp.protect(packet)
            call.frames_sent += 1  # one stream goes on from the last: SRTP would refuse a repeated index
            call.rtp.sendto(packet, call.remote_rtp)
            call.last_sent = packet
            delay = start + (i + 1) * 0.02 - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)

    def heard(self, call: PeerCall) -> np.ndarray:
        """What came back, at 8 kHz."""
        if call.codec == "opus":
            decode = OpusDecoder(sample_rate=8000).decode
        else:
            decode = ulaw_decode if call.codec == "PCMU" else alaw_decode
        audio = [decode(p) for p, pt in zip(call.received, call.received_pts) if pt == call.payload_type]
        return np.concatenate(audio) if audio else np.zeros(0, np.int16)


@contextlib.asynccontextmanager
async def echo_worker(*, worker_id: str, rtp_timeout_s: float, **overrides: Any) -> AsyncIterator[MediaWorker]:
    """A started worker on free loopback ports (SIP, and 38 RTP ports) whose calls talk to the echo agent; closed
    after. ``overrides`` are further WorkerSettings."""
    from gateway.providers.echo import EchoConfig, EchoModel
    from gateway.worker.settings import WorkerSettings
    from gateway.worker.worker import MediaWorker
    from tests.support.procs import free_ports

    rtp_low = free_ports(40)[0]
    rtp_low += rtp_low % 2
    settings = WorkerSettings(
        worker_id=worker_id,
        sip_port=overrides.pop("sip_port", None) or free_ports(1)[0],
        rtp_ports=f"{rtp_low}-{rtp_low + 37}",
        rtp_timeout_s=rtp_timeout_s,
        capacity=8,
        **overrides,
    )
    worker = MediaWorker(settings, model_factory=lambda name: EchoModel(EchoConfig(delay_frames=1)))
    await worker.start()
    try:
        yield worker
    finally:
        await worker.aclose()
