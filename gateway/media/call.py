"""Per-call media state: negotiated codec, symmetric-RTP latching, direction, RTP sender and RTCP state.

Rules (pure logic, no I/O):

- **Latching (symmetric RTP, RFC 4961 practice).** Until latched, RTP goes to the address signalled in SDP.
  The first *valid* packet (parses, carries the audio or telephone-event payload type) whose source IP is
  the signalled IP latches the send address to that packet's exact (ip, port) — the NAT-mapped port. With
  ``latch_any_source`` the first valid packet from any address latches (for peers behind NAT whose SDP
  carries a private address). After latching, packets from any other (ip, port) are counted as
  ``foreign_source`` and dropped; :meth:`MediaCall.update_remote` (a re-INVITE) starts latching afresh.
  RTCP latches the same way, on its own address (or shares the RTP address with rtcp-mux, RFC 5761).
- **Direction (RFC 3264 §5.1, our own attribute in the answer/offer we sent).** ``sendrecv``: send and
  receive. ``sendonly``: send; received audio is ignored. ``recvonly``/``inactive``: no RTP is sent (the
  peer put us on hold); the RTP clock keeps running, so timestamps stay continuous, and the first packet
  after resuming carries the marker bit. RTCP continues in every direction, as §5.1 requires.
  Telephone-events are honoured whatever the direction.
- **Telephone-events on receive** are handled on arrival (not through the jitter buffer). A sender replaces
  audio with them, so the audio playout sees a gap for the event's length: it is concealed (faded) and then
  silent; the next audio packet resumes playout in place if its frame is not yet due, else playout re-anchors on
  it (an underrun). The gap is counted in ``concealed`` (and ``underruns`` when it re-anchored) but not in
  ``lost`` (sequence numbers stay contiguous).
- **Sender.** SSRC, first sequence number and first timestamp are passed in (random, from the caller). Each
  tick advances the timestamp by 20 ms of the clock (160 at 8 kHz, 960 at 48 kHz) whether or not a packet is
  sent; the sequence number advances per packet sent. Ticks the worker's clock skipped after a stall advance
  it too (:meth:`MediaCall.skip_ticks`): the phone sees a gap in the timestamps, as with silence suppression,
  and plays what follows on time, instead of every later packet arriving that much late. The marker bit is
  set on the first packet, after a hold, and (``marker_on_talkspurt``) on the first audio frame after a run
  of silence (``None``) frames.
- **Inactivity.** ``inactive_for(now)`` is the time since the last valid RTP packet (or since the call was
  added), for the session's RTP-timeout rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.media import jitter, reception
from gateway.media.errors import DtmfPayloadError, LocalMediaError, RtcpError, RtpError
from gateway.media.jitter import JitterBuffer, JitterConfig
from gateway.media.reception import ReceptionStats
from gateway.media.rfc4733 import DtmfReceived, DtmfReceiver, DtmfSender
from gateway.media.rtcp import (
    Bye,
    ReportBlock,
    SenderReport,
    build_report,
    ntp_middle,
    parse_rtcp,
    round_trip_seconds,
)
from gateway.media.rtp import RtpPacket, pack_rtp_header, parse_rtp
from gateway.media.srtp import SrtpConfig, SrtpContext
from telcodecs.g711 import alaw_is_quiet, ulaw_is_quiet

Codec = Literal["PCMU", "PCMA", "opus", "G722"]
Direction = Literal["sendrecv", "sendonly", "recvonly", "inactive"]
Address = tuple[str, int]

# G.722 samples at 16 kHz but its RTP clock is 8000 (RFC 3551 §4.5.2): 160 per 20 ms, like G.711, and one
# octet per clock tick at 64 kbit/s, so its payloads are re-framed in the same 10 ms units of 80 octets.
_CLOCK = {"PCMU": 8000, "PCMA": 8000, "opus": 48000, "G722": 8000}
PROBE_INTERVAL_S = 1.0  # one received packet per call per second is timed from arrival to its frame's send


@dataclass(frozen=True, slots=True, kw_only=True)
class MediaCallConfig:
    """What SDP negotiated for one call, plus the random sender start values (RFC 3550 §5.1)."""

    call_id: str
    codec: Codec
    payload_type: int
    remote_rtp: Address
    ssrc: int
    initial_sequence: int
    initial_timestamp: int
    telephone_event_pt: int | None = None
    channels: int = 1  # opus: 1 or 2 channels to send (SDP stereo=1); receiving always downmixes to mono
    remote_rtcp: Address | None = None  # None: RTP port + 1, or the RTP address with rtcp_mux
    rtcp_mux: bool = False
    direction: Direction = "sendrecv"
    latch_any_source: bool = False
    marker_on_talkspurt: bool = True
    cname: str = "gateway"
    opus_bitrate: int = 32000
    jitter: JitterConfig = field(default_factory=JitterConfig)
    srtp: SrtpConfig | None = None  # SDES-keyed SRTP/SRTCP both ways (gateway/media/srtp.py); None: plain RTP

    def __post_init__(self) -> None:
        if self.codec not in _CLOCK:
            raise LocalMediaError(f"unsupported codec {self.codec!r}; PCMU, PCMA, G722 or opus")
        for pt in (self.payload_type, self.telephone_event_pt):
            if pt is not None and not 0 <= pt <= 127:
                raise LocalMediaError(f"payload type {pt} outside 0..127")
        if self.payload_type == self.telephone_event_pt:
            raise LocalMediaError("audio and telephone-event payload types must differ")
        if self.channels not in (1, 2) or (self.codec != "opus" and self.channels != 1):
            raise LocalMediaError(f"channels={self.channels}: G.711 and G.722 are mono, opus is 1 or 2")
        if self.direction not in ("sendrecv", "sendonly", "recvonly", "inactive"):
            raise LocalMediaError(f"unknown direction {self.direction!r}")
        if not 0 <= self.ssrc <= 0xFFFFFFFF or not 0 <= self.initial_sequence <= 0xFFFF:
            raise LocalMediaError("ssrc must be 32-bit and initial_sequence 16-bit")
        if not 0 <= self.initial_timestamp <= 0xFFFFFFFF:
            raise LocalMediaError("initial_timestamp must be 32-bit")

    @property
    def clock_rate(self) -> int:
        return _CLOCK[self.codec]

    @property
    def samples_per_frame(self) -> int:
        """RTP timestamp units per 20 ms."""
        return self.clock_rate // 50


@dataclass(frozen=True, slots=True, kw_only=True)
class MediaStats:
    """A snapshot of one call's media counters (for /v1 call detail, metrics and the call record)."""

    call_id: str
    codec: str
    received: int
    lost: int
    loss_fraction: float
    late: int
    duplicates: int
    reordered: int
    concealed: int
    discarded: int
    inserted: int = 0  # frames inserted in a pause to grow the delay (Opus: so FEC serves the next loss)
    underruns: int
    resyncs: int
    jitter_ts: float
    jitter_ms: float
    target_delay_ms: int
    buffered_ms: int
    malformed: int
    foreign_source: int
    dropped: dict[str, int]
    packets_sent: int
    octets_sent: int
    dtmf_received: int
    dtmf_sent: int
    send_address: Address
    latched: bool
    rtt_ms: float | None
    remote_fraction_lost: float | None
    remote_cumulative_lost: int | None
    remote_jitter_ms: float | None
    remote_bye: bool
    inactive_for: float
    srtp: str = ""  # the SRTP suite protecting the call's media, "" for plain RTP


class MediaCall:
    """All media state of one call; the tick engine drives it. See the module docstring for the rules."""

    __slots__ = (
        "_last_audio",
        "_marker_pending",
        "_peer_lsr",
        "_peer_sr_arrival",
        "_probe_due",
        "_rtcp_count",
        "_sequence",
        "_tick_now",
        "_tick_ts",
        "_timestamp",
        "config",
        "created_at",
        "direction",
        "dropped",
        "dtmf_in",
        "dtmf_out",
        "events",
        "inbound_index",
        "jitter_buffer",
        "last_packet_at",
        "latched",
        "next_rtcp_at",
        "octets_sent",
        "packets_sent",
        "probe",
        "reception",
        "remote_bye",
        "remote_report",
        "remote_rtp",
        "rtcp_address",
        "rtcp_latched",
        "rtt",
        "send_address",
        "srtp",
        "stream_restarted",
    )

    def __init__(self, config: MediaCallConfig, *, now: float) -> None:
        self.config = config
        clock = config.clock_rate
        quiet: Callable[[bytes], bool] | None
        if config.codec == "opus":
            unit_samples, upf, unit_bytes, quiet = clock // 50, 1, 0, None
        elif config.codec == "G722":
            # ADPCM codes cannot be judged quiet without decoding: the tick reports the decoded level (heard()).
            unit_samples, upf, unit_bytes, quiet = clock // 100, 2, clock // 100, None
        else:
            unit_samples, upf, unit_bytes = clock // 100, 2, clock // 100
            quiet = ulaw_is_quiet if config.codec == "PCMU" else alaw_is_quiet
        self.jitter_buffer = JitterBuffer(
            clock_rate=clock,
            unit_samples=unit_samples,
            units_per_frame=upf,
            unit_bytes=unit_bytes,
            config=config.jitter,
            quiet=quiet,
            fec=config.codec == "opus",
        )
        self.reception = ReceptionStats(clock)
        # The peer's stream started afresh (new SSRC or sequence restart): a stateful decoder (G.722) is reset
        # before the new stream's first frame, as the peer's new encoder was. The tick clears it.
        self.stream_restarted = False
        self.dtmf_in = DtmfReceiver(config.call_id)
        self.dtmf_out = DtmfSender(clock_rate=clock)
        self.events: list[DtmfReceived] = []
        # One received packet per PROBE_INTERVAL_S is followed to its frame: (extended timestamp, arrival).
        self.probe: tuple[int, float] | None = None
        self._probe_due = now
        self.dropped: dict[str, int] = {}
        self.direction: Direction = config.direction
        self.created_at = now
        self.last_packet_at: float | None = None
        self.inbound_index = 0
        self._sequence = config.initial_sequence
        self._timestamp = config.initial_timestamp
        self._tick_ts = config.initial_timestamp
        self._tick_now = now
        self._marker_pending = True
        self._last_audio = False
        self.packets_sent = 0
        self.octets_sent = 0
        # RTCP: schedule spread by SSRC so calls added together do not report together (§6.2 randomisation).
        self._rtcp_count = 0
        self.next_rtcp_at = now + 2.5 * (0.5 + (config.ssrc % 1000) / 1000.0)
        self._peer_lsr = 0
        self._peer_sr_arrival = 0
        self.rtt: float | None = None
        self.remote_report: ReportBlock | None = None
        self.remote_bye = False
        self.srtp = SrtpContext(config.srtp) if config.srtp is not None else None
        self.update_remote(config.remote_rtp, config.remote_rtcp)

    # ------------------------------------------------------------------------------------- signalling

    def update_remote(self, remote_rtp: Address, remote_rtcp: Address | None = None) -> None:
        """New signalled address (initial SDP or re-INVITE): latching starts again."""
        self.remote_rtp = (remote_rtp[0], remote_rtp[1])
        self.send_address = self.remote_rtp
        self.latched = False
        if self.config.rtcp_mux:
            self.rtcp_address = self.remote_rtp
        elif remote_rtcp is not None:
            self.rtcp_address = (remote_rtcp[0], remote_rtcp[1])
        else:
            self.rtcp_address = (remote_rtp[0], remote_rtp[1] + 1)
        self.rtcp_latched = False

    def set_direction(self, direction: Direction) -> None:
        if direction not in ("sendrecv", "sendonly", "recvonly", "inactive"):
            raise LocalMediaError(f"unknown direction {direction!r}")
        self.direction = direction

    @property
    def can_send(self) -> bool:
        return self.direction == "sendrecv" or self.direction == "sendonly"

    @property
    def can_receive(self) -> bool:
        return self.direction == "sendrecv" or self.direction == "recvonly"

    def inactive_for(self, now: float) -> float:
        """Seconds since the last valid RTP packet (or since the call was added)."""
        last = self.last_packet_at
        return now - (self.created_at if last is None else last)

    def drop(self, reason: str) -> str:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        return reason

    # ------------------------------------------------------------------------------------------ SRTP

    def set_srtp(self, config: SrtpConfig) -> None:
        """New SRTP keys from a re-offer: only the direction whose key changed starts a new context."""
        if self.srtp is None:
            raise LocalMediaError(f"call {self.config.call_id} is plain RTP; SRTP cannot start mid-call")
        self.srtp.rekey(config)

    def srtp_drop_reason(self, reason: str, data: bytes) -> str:
        """The label of a received datagram that SRTP refused (``reason``): ``srtp_<reason>``, or
        ``srtp_plaintext`` when it is exactly a plain RTP packet of this call, whatever libsrtp said first (it
        checks the replay window before the tag, so a plain packet with an old sequence number is a "replay")."""
        if reason != "too_long" and self._is_plain_rtp(data):
            return "srtp_plaintext"
        return "srtp_" + reason

    def _is_plain_rtp(self, data: bytes) -> bool:
        """Whether a datagram that failed authentication is exactly a plain RTP packet of this call: our audio
        payload type with whole 10 ms of G.711 or G.722 (an SRTP packet's tag, 4 or 10 octets, never makes a whole
        number of 80-octet units), or a telephone-event of exactly 4 octets (with a tag it is 8 or more).
        Opus payloads have no such size, so an Opus call counts a plain packet as an authentication failure."""
        try:
            packet = parse_rtp(data)
        except RtpError:
            return False
        cfg = self.config
        size = len(packet.payload)
        if packet.payload_type == cfg.payload_type:
            return cfg.codec != "opus" and size > 0 and size % 80 == 0
        return packet.payload_type == cfg.telephone_event_pt and size == 4

    # --------------------------------------------------------------------------------------- receive

    def receive(self, packet: RtpPacket, source: tuple[Any, ...], now: float) -> str | None:
        """Account for one parsed RTP packet; returns None when used, else the drop reason (counted)."""
        cfg = self.config
        host, port = source[0], source[1]
        if self.latched:
            if host != self.send_address[0] or port != self.send_address[1]:
                return self.drop("foreign_source")
        elif host != self.remote_rtp[0] and not cfg.latch_any_source:
            return self.drop("foreign_source")
        pt = packet.payload_type
        audio = pt == cfg.payload_type
        if not audio and pt != cfg.telephone_event_pt:
            return self.drop("unknown_payload_type")
        if not self.latched:
            self.send_address = (str(host), int(port))
            self.latched = True
        self.last_packet_at = now
        rx = self.reception
        status = rx.update(packet.sequence_number, packet.timestamp, packet.ssrc, now, audio=audio)
        if status >= reception.DUPLICATE:
            if status == reception.DUPLICATE:
                return self.drop("duplicate")
            if status == reception.OUT_OF_RANGE:
                return self.drop("out_of_range")
            self.jitter_buffer.reset()  # new SSRC or sequence restart: playout resyncs on this packet
            self.stream_restarted = True
        if not audio:
            try:
                event = self.dtmf_in.feed(packet.timestamp, packet.payload, now)
            except DtmfPayloadError:
                return self.drop("malformed_dtmf")
            if event is not None:
                self.events.append(event)
            return None
        if not self.can_receive:
            return self.drop("direction")
        payload = packet.payload
        if cfg.codec == "opus":
            if not payload:
                return self.drop("short_payload")
            if opus_packet_samples(payload) != 960:
                return self.drop("unsupported_ptime")
        elif len(payload) < 80:
            return self.drop("short_payload")
        elif cfg.codec == "G722" and len(payload) % 80:
            # G.722 at 64 kbit/s is 80 octets per 10 ms; any other size is not a whole number of samples' codes,
            # and an ADPCM decoder fed a misaligned stream would mistrack until it recovered.
            return self.drop("malformed_g722_size")
        pushed = self.jitter_buffer.push(rx.ext_ts, payload, in_order=status != reception.REORDERED)
        if pushed == jitter.LATE:
            return self.drop("late")
        if pushed == jitter.DUPLICATE:
            return self.drop("duplicate")
        if now >= self._probe_due and self.probe is None:
            self.probe = (rx.ext_ts, now)
            self._probe_due = now + PROBE_INTERVAL_S
        return None

    def probe_played(self, now: float) -> float | None:
        """After a pop: the arrival time of the probed packet if the frame just played carries it, else None.

        A probe the playout point has passed without playing it (concealed, resynced) is dropped; so is one
        older than a second, whatever happened to it."""
        probe = self.probe
        if probe is None:
            return None
        ts, arrived = probe
        played = self.jitter_buffer.last_played()
        if played is not None and played[1] > ts:
            self.probe = None
            if played[0] <= ts and self.jitter_buffer.status == jitter.PLAYED:
                return arrived
        elif now - arrived > PROBE_INTERVAL_S:
            self.probe = None
        return None

    # ------------------------------------------------------------------------------------------ send

    def send_dtmf(self, digits: str, *, duration_ms: int = 100, volume: int = 10) -> None:
        if self.config.telephone_event_pt is None:
            raise LocalMediaError(f"call {self.config.call_id}: the peer did not negotiate telephone-event")
        self.dtmf_out.queue(digits, duration_ms=duration_ms, volume=volume)

    def skip_ticks(self, ticks: int) -> None:
        """The clock skipped ``ticks`` ticks (a stall): advance the RTP clock by them, send nothing for them, and
        let the jitter buffer drop as many frames of the caller's next pause (the delay the stall added)."""
        if ticks <= 0:
            return
        self._timestamp = (self._timestamp + ticks * self.config.samples_per_frame) & 0xFFFFFFFF
        self.jitter_buffer.skip(ticks)  # the caller's audio of those ticks waits: given back in its next pause

    def next_packet(self, payload: bytes, has_audio: bool, now: float) -> bytes | None:
        """The RTP packet for this tick (audio, or a DTMF packet replacing it), or None while not sending."""
        cfg = self.config
        ts = self._timestamp
        self._timestamp = (ts + cfg.samples_per_frame) & 0xFFFFFFFF
        self._tick_ts = ts
        self._tick_now = now
        if not self.can_send:
            self._marker_pending = True
            self._last_audio = False
            return None
        dtmf_out = self.dtmf_out
        dtmf = dtmf_out.next_packet(ts) if dtmf_out.active else None
        if dtmf is not None:
            marker, payload, ts = dtmf
            pt = cfg.telephone_event_pt
            assert pt is not None  # send_dtmf refuses to queue without it
        else:
            marker = self._marker_pending or (cfg.marker_on_talkspurt and has_audio and not self._last_audio)
            pt = cfg.payload_type
        self._marker_pending = False
        self._last_audio = has_audio
        seq = self._sequence
        self._sequence = (seq + 1) & 0xFFFF
        self.packets_sent += 1
        self.octets_sent += len(payload)
        packet = pack_rtp_header(marker, pt, seq, ts, cfg.ssrc) + payload
        srtp = self.srtp
        return packet if srtp is None else srtp.protect(packet)

    # ------------------------------------------------------------------------------------------ RTCP

    def schedule_rtcp(self, now: float, interval: float) -> None:
        """Next report in [0.5, 1.5] x interval (§6.3.1 randomisation, derived from SSRC and a counter so the
        core stays deterministic)."""
        self._rtcp_count += 1
        spread = ((self.config.ssrc * 2654435761 + self._rtcp_count * 40503) & 0xFFFF) / 65536.0
        self.next_rtcp_at = now + interval * (0.5 + spread)

    def rtcp_report(self, now: float, ntp_now: int) -> bytes:
        """Our compound report: SR if we have sent RTP (else RR), one block about the peer if heard."""
        cfg = self.config
        rx = self.reception
        blocks: tuple[ReportBlock, ...] = ()
        if rx.ssrc is not None:
            fraction, lost, highest, jit = rx.report_block()
            dlsr = 0
            if self._peer_lsr:
                dlsr = (ntp_middle(ntp_now) - self._peer_sr_arrival) & 0xFFFFFFFF
            blocks = (ReportBlock(rx.ssrc, fraction, lost, highest, jit, self._peer_lsr, dlsr),)
        sender = None
        if self.packets_sent:
            rtp_ts = self._tick_ts + int((now - self._tick_now) * cfg.clock_rate)
            sender = SenderReport(
                ssrc=cfg.ssrc,
                ntp_timestamp=ntp_now,
                rtp_timestamp=rtp_ts & 0xFFFFFFFF,
                packet_count=self.packets_sent,
                octet_count=self.octets_sent,
            )
        report = build_report(ssrc=cfg.ssrc, cname=cfg.cname, sender=sender, reports=blocks)
        srtp = self.srtp
        return report if srtp is None else srtp.protect_rtcp(report)

    def rtcp_receive(self, data: bytes, source: tuple[Any, ...], ntp_now: int) -> str | None:
        """Account for one RTCP datagram from the peer; None when used, else the drop reason (counted)."""
        host, port = source[0], source[1]
        if self.rtcp_latched:
            if host != self.rtcp_address[0] or port != self.rtcp_address[1]:
                return self.drop("rtcp_foreign_source")
        elif host != self.remote_rtp[0] and not self.config.latch_any_source:
            return self.drop("rtcp_foreign_source")
        try:
            packets = parse_rtcp(data)
        except RtcpError as exc:
            return self.drop(f"rtcp_malformed_{exc.reason}")
        if not self.rtcp_latched:
            self.rtcp_address = (str(host), int(port))
            self.rtcp_latched = True
        ours = self.config.ssrc
        for packet in packets:
            if isinstance(packet, Bye):
                self.remote_bye = self.remote_bye or (self.reception.ssrc in packet.ssrcs)
                continue
            if isinstance(packet, SenderReport):
                self._peer_lsr = ntp_middle(packet.ntp_timestamp)
                self._peer_sr_arrival = ntp_middle(ntp_now)
            for block in packet.reports:
                if block.ssrc == ours:
                    self.remote_report = block
                    rtt = round_trip_seconds(block, ntp_now)
                    if rtt is not None:
                        self.rtt = rtt
        return None

    # --------------------------------------------------------------------------------------- reading

    def stats(self, now: float) -> MediaStats:
        rx = self.reception
        jb = self.jitter_buffer
        clock = self.config.clock_rate
        remote = self.remote_report
        dropped = dict(self.dropped)
        malformed = sum(v for k, v in dropped.items() if "malformed" in k)
        return MediaStats(
            call_id=self.config.call_id,
            codec=self.config.codec,
            received=rx.received_total,
            lost=rx.cumulative_lost,
            loss_fraction=rx.loss_fraction,
            late=jb.late,
            duplicates=rx.duplicates + jb.duplicates,
            reordered=rx.reordered,
            concealed=jb.concealed,
            discarded=jb.discarded,
            inserted=jb.inserted,
            underruns=jb.underruns,
            resyncs=jb.resyncs + rx.source_changes + rx.restarts,
            jitter_ts=rx.jitter,
            jitter_ms=rx.jitter_ms,
            target_delay_ms=jb.target_ms,
            buffered_ms=jb.buffered_ms,
            malformed=malformed,
            foreign_source=dropped.get("foreign_source", 0),
            dropped=dropped,
            packets_sent=self.packets_sent,
            octets_sent=self.octets_sent,
            dtmf_received=self.dtmf_in.presses,
            dtmf_sent=self.dtmf_out.sent,
            send_address=self.send_address,
            latched=self.latched,
            rtt_ms=None if self.rtt is None else self.rtt * 1000.0,
            remote_fraction_lost=None if remote is None else remote.fraction_lost / 256.0,
            remote_cumulative_lost=None if remote is None else remote.cumulative_lost,
            remote_jitter_ms=None if remote is None else remote.jitter * 1000.0 / clock,
            remote_bye=self.remote_bye,
            inactive_for=self.inactive_for(now),
            srtp=self.srtp.suite if self.srtp is not None else "",
        )


# Opus TOC (RFC 6716 §3.1): frame duration in 48 kHz samples by configuration number.
_OPUS_FRAME = (
    [480, 960, 1920, 2880] * 3  # SILK NB/MB/WB: 10, 20, 40, 60 ms
    + [480, 960] * 2  # Hybrid SWB/FB: 10, 20 ms
    + [120, 240, 480, 960] * 4  # CELT NB/WB/SWB/FB: 2.5, 5, 10, 20 ms
)


def opus_packet_samples(payload: bytes) -> int:
    """Samples (at 48 kHz) one Opus packet decodes to, from its TOC byte; 0 if the packet is malformed."""
    toc = payload[0]
    frame = _OPUS_FRAME[toc >> 3]
    code = toc & 0x03
    if code == 0:
        return frame
    if code in (1, 2):
        return 2 * frame
    if len(payload) < 2:
        return 0
    return (payload[1] & 0x3F) * frame
