"""Exports the sans-I/O cores' counters to Prometheus, once a second, off the media tick.

The SIP endpoint and the tick engine count what they drop and why in plain integers (they must not import
prometheus-client, and a metric call per packet would cost the hot path). This module turns the growth of
those integers since the last export into counter increments.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import NamedTuple

from gateway.media.call import MediaCall, MediaStats
from gateway.observability import (
    AGENT_AUDIO_GAPS_TOTAL,
    AGENT_AUDIO_WAIT_SECONDS,
    OPUS_ENCODE_MOVES_TOTAL,
    PLAYOUT_EVENTS_TOTAL,
    PROVIDER_LATENCY_SECONDS,
    RTP_DROPPED_TOTAL,
    RTP_JITTER_MS,
    RTP_LOST_TOTAL,
    RTP_PACKETS_TOTAL,
    SIP_BLOCKS_TOTAL,
    SIP_CONNECTIONS,
    SIP_MESSAGES_TOTAL,
    SIP_REJECTED_TOTAL,
    SIP_TRANSPORT_ERRORS_TOTAL,
    SIP_TRANSPORT_MESSAGES_TOTAL,
    SRTP_DROPPED_TOTAL,
)
from gateway.session.turns import LatencyObserver
from gateway.sip.events import SipStats
from gateway.transport.sip_streams import TransportStats

# SipStats fields that mean "this input was refused or dropped", exported as gateway_sip_rejected_total{reason}
SIP_REJECT_REASONS = (
    "malformed_answered",
    "malformed_dropped",
    "policy_rejected",
    "policy_dropped",
    "auth_challenged",
    "auth_failed",
    "blocked_dropped",
    "scanner_dropped",
    "unmatched_responses",
    "unmatched_acks",
    "internal_errors",
)


class CallFigures(NamedTuple):
    """One live call's running totals (from its MediaStats and its session)."""

    call_id: str
    lost: int
    jitter_ms: float | None  # None: the call's media is not ours to measure (a browser call: aiortc's)
    concealed: int
    underruns: int
    discarded: int
    agent_audio_gaps: int
    inserted: int = 0


def call_figures(call_id: str, media: MediaStats, *, agent_audio_gaps: int) -> CallFigures:
    return CallFigures(
        call_id,
        media.lost,
        media.jitter_ms,
        media.concealed,
        media.underruns,
        media.discarded,
        agent_audio_gaps,
        media.inserted,
    )


def live_call_figures(call_id: str, media: MediaCall, *, agent_audio_gaps: int) -> CallFigures:
    """:func:`call_figures` of a live call, read off its media state without building the whole
    :class:`MediaStats` snapshot (the export runs every second for every call)."""
    rx, jb = media.reception, media.jitter_buffer
    return CallFigures(
        call_id,
        rx.cumulative_lost,
        rx.jitter_ms,
        jb.concealed,
        jb.underruns,
        jb.discarded,
        agent_audio_gaps,
        jb.inserted,
    )


def session_figures(call_id: str, *, agent_audio_gaps: int, concealed: int = 0) -> CallFigures:
    """A call whose media the tick engine does not carry (a browser call): its session's figures, and the
    frames its receive path concealed when that path is ours."""
    return CallFigures(call_id, 0, None, concealed, 0, 0, agent_audio_gaps)


# CallFigures fields exported as gateway_playout_events_total{event}
_PLAYOUT_EVENTS = (
    ("concealed", "concealed"),
    ("underrun", "underruns"),
    ("discarded", "discarded"),
    ("inserted", "inserted"),
)


class CounterExporter:
    """Remembers the last exported value of every source counter and increments by the difference."""

    def __init__(self, worker: str) -> None:
        self.worker = worker
        self._last: dict[tuple[str, str], int] = {}
        self._jitter = RTP_JITTER_MS.labels(worker)  # one child, looked up once instead of per call per export

    def _delta(self, family: str, key: str, value: int) -> int:
        previous = self._last.get((family, key), 0)
        self._last[(family, key)] = value
        return value - previous if value >= previous else value  # a restarted source counts from zero

    def sip(self, stats: SipStats) -> None:
        values = {f.name: getattr(stats, f.name) for f in fields(stats)}
        for reason in SIP_REJECT_REASONS:
            delta = self._delta("sip_rejected", reason, values[reason])
            if delta:
                SIP_REJECTED_TOTAL.labels(self.worker, reason).inc(delta)
        blocks = self._delta("sip_blocks", "", values["sources_blocked"])
        if blocks:
            SIP_BLOCKS_TOTAL.labels(self.worker).inc(blocks)
        for kind, name in (("request", "requests_received"), ("response", "responses_received")):
            delta = self._delta("sip_messages", kind, values[name])
            if delta:
                SIP_MESSAGES_TOTAL.labels(self.worker, kind).inc(delta)

    def sip_transport(self, stats: TransportStats, connections: Mapping[str, int]) -> None:
        """Messages per transport, connections refused/closed/failed per transport and reason, open connections."""
        for transport in ("udp", "tcp", "tls"):
            delta = self._delta("sip_transport_messages", transport, getattr(stats, f"{transport}_received"))
            if delta > 0:
                SIP_TRANSPORT_MESSAGES_TOTAL.labels(self.worker, transport).inc(delta)
        for (transport, reason), value in stats.errors().items():
            delta = self._delta("sip_transport_errors", f"{transport}/{reason}", value)
            if delta > 0:
                SIP_TRANSPORT_ERRORS_TOTAL.labels(self.worker, transport, reason).inc(delta)
        for transport, count in connections.items():
            SIP_CONNECTIONS.labels(self.worker, transport).set(count)

    def rtp_dropped(self, dropped: Mapping[str, int]) -> None:
        """The tick's drops by reason: SRTP's refusals (``srtp_*``, ``srtcp_*``) as gateway_srtp_dropped_total,
        the rest as gateway_rtp_dropped_total."""
        for reason, count in dropped.items():
            delta = self._delta("rtp_dropped", reason, count)
            if delta:
                metric = SRTP_DROPPED_TOTAL if reason.startswith(("srtp_", "srtcp_")) else RTP_DROPPED_TOTAL
                metric.labels(self.worker, reason).inc(delta)

    def rtp_packets(self, received: int, sent: int) -> None:
        for direction, value in (("in", received), ("out", sent)):
            delta = self._delta("rtp_packets", direction, value)
            if delta > 0:
                RTP_PACKETS_TOTAL.labels(self.worker, direction).inc(delta)

    def opus_moves(self, moves: Mapping[str, int]) -> None:
        for to, count in moves.items():
            if (delta := self._delta("opus_moves", to, count)) > 0:
                OPUS_ENCODE_MOVES_TOTAL.labels(self.worker, to).inc(delta)

    def calls(self, calls: Iterable[CallFigures]) -> None:
        """Every live call's totals: loss, playout events and agent audio gaps grow; one jitter sample each."""
        for figures in calls:
            self._grow(figures)
            if figures.jitter_ms is not None:
                self._jitter.observe(figures.jitter_ms)

    def call_ended(self, call_id: str, figures: CallFigures | None) -> None:
        """The call's last growth since the previous export (``figures`` None: it had no media), then forgets it."""
        if figures is not None:
            self._grow(figures)
        for family in ("rtp_lost", "agent_audio_gaps", *(name for _, name in _PLAYOUT_EVENTS)):
            self._last.pop((family, call_id), None)

    def _grow(self, figures: CallFigures) -> None:
        call_id = figures.call_id
        if (delta := self._delta("rtp_lost", call_id, figures.lost)) > 0:
            RTP_LOST_TOTAL.labels(self.worker).inc(delta)
        for event, name in _PLAYOUT_EVENTS:
            if (delta := self._delta(name, call_id, getattr(figures, name))) > 0:
                PLAYOUT_EVENTS_TOTAL.labels(self.worker, event).inc(delta)
        if (delta := self._delta("agent_audio_gaps", call_id, figures.agent_audio_gaps)) > 0:
            AGENT_AUDIO_GAPS_TOTAL.labels(self.worker).inc(delta)


def latency_observer(worker: str, provider: str) -> LatencyObserver:
    """A session's latency samples into the worker's histograms (references no call: nothing to keep alive)."""
    round_trip = PROVIDER_LATENCY_SECONDS.labels(worker, provider)
    agent_wait = AGENT_AUDIO_WAIT_SECONDS.labels(worker, provider)

    def observe(kind: str, seconds: float) -> None:
        (round_trip if kind == "round_trip" else agent_wait).observe(seconds)

    return observe
