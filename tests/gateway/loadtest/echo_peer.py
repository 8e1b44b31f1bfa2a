"""A minimal loopback SIP UAS that answers every call and reflects its RTP (for load-generator tests).

Built from the project's own parts (SipEndpoint + SipTransport + RtpPortPool) so the load generator is
tested against real sockets without a gateway process. Reflected packets get the peer's own SSRC,
sequence numbers and timestamps, like a real echo endpoint; ``drop_every`` drops every n-th packet.
"""

from __future__ import annotations

import random
import struct

from gateway.sip.config import SessionTimerConfig, SipConfig
from gateway.sip.endpoint import SipEndpoint
from gateway.sip.events import CallEnded, CallHandle, CallOffered, SipEvent
from gateway.sip.sdp import LocalMedia, build_answer, negotiate, parse_sdp
from gateway.transport.rtp_socket import RtpEndpoint, RtpPortPool, RtpPortRange
from gateway.transport.sip_transport import SipTransport
from gateway.transport.tls import TlsContexts

_HEADER = struct.Struct("!BBHII")


class EchoPeer:
    def __init__(
        self,
        *,
        port: int,
        rtp_ports: tuple[int, int],
        reject: int = 0,
        drop_every: int = 0,
        tls: TlsContexts | None = None,
        tls_port: int = 5061,
    ) -> None:
        """``tls``: SIP over TLS too, listening on ``tls_port`` with the contexts' certificate."""
        transports = ("udp", "tcp", "tls") if tls is not None else ("udp", "tcp")
        self.endpoint = SipEndpoint(
            SipConfig(
                local_port=port,
                tls_port=tls_port,
                rate_limit=None,
                session_timer=SessionTimerConfig(enabled=False),
                transports=transports,
            ),
            rng=random.Random(5),
        )
        self.sip = SipTransport(
            self.endpoint,
            host="127.0.0.1",
            port=port,
            transports=transports,
            on_events=self._on_events,
            tls=tls,
            tls_port=tls_port,
        )
        self.pool = RtpPortPool(RtpPortRange(first=rtp_ports[0], last=rtp_ports[1]))
        self.reject = reject
        self.drop_every = drop_every
        self.rtp: dict[CallHandle, RtpEndpoint] = {}
        self.offers = 0
        self.call_ids: list[str] = []
        self.ended = 0

    async def start(self) -> None:
        await self.sip.start()

    async def aclose(self) -> None:
        await self.sip.aclose()
        for rtp in self.rtp.values():
            self.pool.release(rtp)

    def _on_events(self, events: list[SipEvent]) -> None:
        now = self.sip.now()
        for event in events:
            if isinstance(event, CallOffered):
                self.offers += 1
                self.call_ids.append(event.call_id)
                if self.reject:
                    self.endpoint.reject(event.call, now, status=self.reject)
                    continue
                offer = parse_sdp(event.body)
                negotiated = negotiate(offer, local=LocalMedia())
                rtp = self.pool.allocate()
                self.rtp[event.call] = rtp
                self._reflect(rtp, negotiated.remote_rtp)
                answer = build_answer(
                    offer, negotiated, local_address="127.0.0.1", local_port=rtp.port, session_id=1, session_version=1
                )
                self.endpoint.answer(event.call, now, body=answer.to_bytes())
            elif isinstance(event, CallEnded):
                self.ended += 1
                rtp = self.rtp.pop(event.call, None)
                if rtp is not None:
                    self.pool.release(rtp)

    def _reflect(self, rtp: RtpEndpoint, remote: tuple[str, int]) -> None:
        state = {"seq": 1000, "ssrc": 0x1234, "ts_offset": 77777, "n": 0}

        def on_rtp(data: bytes, addr: tuple[str, int]) -> None:
            state["n"] += 1
            state["seq"] += 1  # a dropped packet still uses its sequence number: the receiver sees a gap
            if self.drop_every and state["n"] % self.drop_every == 0:
                return
            b0, b1, _seq, ts, _ssrc = _HEADER.unpack_from(data)
            header = _HEADER.pack(b0, b1, state["seq"] & 0xFFFF, (ts + state["ts_offset"]) & 0xFFFFFFFF, state["ssrc"])
            rtp.send_rtp(header + data[12:], remote)

        rtp.start(on_rtp, lambda data, addr: None)
