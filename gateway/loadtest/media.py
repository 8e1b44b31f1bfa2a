"""The synthetic callers' RTP, sans-I/O: which packet each call sends on each tick, and what it received.

:class:`FrameSchedule` is the one send clock of a load-generator process. Tick *K* has the absolute deadline
``t0 + K * 20 ms``; a call that starts sending on tick ``K0`` sends its media frame ``K - K0`` on tick *K*. The
frame index comes from the deadline, never from counting ticks, so a tick the process could not run (it fell
behind and the clock skipped it) is a gap in the sequence numbers the target sees as loss, which is the truth
about that generator, and which the report shows as generator skips.

:class:`CallSender` turns frame *k* into a packet (payloads are pre-encoded; RFC 4733 digits replace audio
frames while they play). :class:`CallReceiver` keeps every received audio packet (sequence number, RTP
timestamp, arrival time, payload) for the analysis after the load, and live RFC 3550 statistics for the
progress line. The arrival time is the kernel's receive stamp where the socket gives one (on loopback, when
the target sent the packet), and the time the generator read the packet is kept beside it: the difference is
the generator's own delay, which must not count against the target.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.media.errors import RtpError
from gateway.media.reception import ReceptionStats
from gateway.media.rfc4733 import DtmfSender
from gateway.media.rtp import looks_like_rtcp, pack_rtp_header, parse_rtp
from gateway.media.srtp import SrtpContext, SrtpError

FRAME_S = 0.02


class FrameSchedule:
    """Maps absolute tick deadlines to tick numbers on one grid shared by every call of a process."""

    __slots__ = ("period", "t0")

    def __init__(self, t0: float, *, period: float = FRAME_S) -> None:
        self.t0 = t0
        self.period = period

    def tick(self, deadline: float) -> int:
        return round((deadline - self.t0) / self.period)

    def deadline(self, tick: int) -> float:
        return self.t0 + tick * self.period

    def next_tick(self, now: float) -> int:
        """The first tick whose deadline is strictly after ``now``."""
        k = int((now - self.t0) // self.period) + 1
        return max(k, 0)


class CallSender:
    """One call's outbound stream: frame k -> RTP packet, on the shared grid from ``start_tick``."""

    __slots__ = (
        "_dtmf",
        "_dtmf_at",
        "_silence",
        "payload_type",
        "payloads",
        "sent",
        "seq0",
        "srtp",
        "ssrc",
        "start_tick",
        "step",
        "telephone_event_pt",
        "ts0",
    )

    def __init__(
        self,
        *,
        payloads: Sequence[bytes],
        silence: bytes,
        payload_type: int,
        samples_per_frame: int,
        ssrc: int,
        seq0: int,
        ts0: int,
        start_tick: int,
        dtmf: str = "",
        dtmf_at_frame: int = 0,
        telephone_event_pt: int | None = None,
        clock_rate: int = 8000,
        srtp: SrtpContext | None = None,
    ) -> None:
        self.payloads = payloads
        self.srtp = srtp  # an SRTP call's context: every packet is protected as it is made
        self._silence = silence
        self.payload_type = payload_type
        self.step = samples_per_frame
        self.ssrc = ssrc
        self.seq0 = seq0
        self.ts0 = ts0
        self.start_tick = start_tick
        self.sent = 0
        self.telephone_event_pt = telephone_event_pt
        self._dtmf: DtmfSender | None = None
        self._dtmf_at = dtmf_at_frame
        if dtmf and telephone_event_pt is not None:
            self._dtmf = DtmfSender(clock_rate=clock_rate)
            self._dtmf.queue(dtmf)

    def packet(self, tick: int) -> bytes | None:
        """The datagram for ``tick`` (None before the call's first tick)."""
        k = tick - self.start_tick
        if k < 0:
            return None
        ts = (self.ts0 + k * self.step) & 0xFFFFFFFF
        seq = (self.seq0 + k) & 0xFFFF
        dtmf = self._dtmf
        if dtmf is not None and k >= self._dtmf_at and dtmf.active:
            marker, payload, event_ts = dtmf.next_packet(ts) or (False, b"", ts)
            if payload:
                self.sent += 1
                assert self.telephone_event_pt is not None
                packet = pack_rtp_header(marker, self.telephone_event_pt, seq, event_ts, self.ssrc) + payload
                return packet if self.srtp is None else self.srtp.protect(packet)
        payloads = self.payloads
        payload = payloads[k] if k < len(payloads) else self._silence
        self.sent += 1
        packet = pack_rtp_header(k == 0, self.payload_type, seq, ts, self.ssrc) + payload
        return packet if self.srtp is None else self.srtp.protect(packet)

    @property
    def dtmf_sent(self) -> int:
        """Digits sent completely (they play in the plan's first pause, so they replace silence, not speech)."""
        return self._dtmf.sent if self._dtmf is not None else 0


class CallReceiver:
    """Every audio packet of one call's inbound stream, plus live RFC 3550 statistics."""

    __slots__ = (
        "arrivals",
        "audio_pt",
        "other",
        "payloads",
        "reads",
        "rtcp",
        "seqs",
        "srtp",
        "srtp_refused",
        "stats",
        "timestamps",
    )

    def __init__(self, *, audio_pt: int, clock_rate: int) -> None:
        self.audio_pt = audio_pt
        self.stats = ReceptionStats(clock_rate)
        self.seqs: list[int] = []
        self.timestamps: list[int] = []
        self.arrivals: list[float] = []  # the kernel's receive time where the socket gives it
        self.reads: list[float] = []  # when this process read each packet (only when arrivals are the kernel's)
        self.payloads: list[bytes] = []
        self.other = 0  # packets of other payload types (telephone-event) or malformed
        self.rtcp = 0
        self.srtp: SrtpContext | None = None  # set when an SRTP call is answered: packets are unprotected first
        self.srtp_refused = 0  # datagrams of an SRTP call that did not authenticate (or replayed)

    def datagram(self, data: bytes, now: float, read_at: float | None = None) -> None:
        """One datagram that arrived at ``now``; ``read_at``: when it was read, if ``now`` is the kernel's stamp."""
        if looks_like_rtcp(data):  # RTCP muxed on the RTP port (RFC 5761)
            self.rtcp += 1
            return
        if self.srtp is not None:
            try:
                data = self.srtp.unprotect(data)
            except SrtpError:
                self.srtp_refused += 1
                return
        try:
            packet = parse_rtp(data)
        except RtpError:
            self.other += 1
            return
        if packet.payload_type != self.audio_pt:
            self.other += 1
            return
        self.seqs.append(packet.sequence_number)
        self.timestamps.append(packet.timestamp)
        self.arrivals.append(now)
        if read_at is not None:
            self.reads.append(read_at)
        self.payloads.append(packet.payload)
        self.stats.update(packet.sequence_number, packet.timestamp, packet.ssrc, now)

    def rtcp_datagram(self, data: bytes, now: float) -> None:
        """RTCP from the far end is only counted: the figures come from the RTP itself."""
        self.rtcp += 1
