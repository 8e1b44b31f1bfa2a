"""Prometheus metrics shared by every part of a gateway process.

Defined once here (the lowest layer that may use prometheus-client) so the media tick, the SIP glue, the
session core and the control plane all count into the same registry, which ``GET /metrics`` serves.
Names follow Prometheus conventions: ``_total`` counters, ``_seconds`` histograms, base units.

:func:`exposition` is how ``GET /metrics`` renders the registry in a process that carries calls: the text of
``generate_latest``, made one metric family at a time, with the event loop let in at least every half
millisecond. ``generate_latest`` holds the loop for the whole registry, long enough that a scrape landing just
before a deadline makes a busy worker's media tick late (docs/performance/2026-12-03-ops-slices.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gateway.slices import SLICE_S, Slices

REGISTRY = CollectorRegistry(auto_describe=True)

ACTIVE_CALLS = Gauge("gateway_active_calls", "Calls currently up on this process", ["worker"], registry=REGISTRY)
CAPACITY = Gauge(
    "gateway_capacity", "What the worker carries, in G.711 calls (GATEWAY_CAPACITY)", ["worker"], registry=REGISTRY
)
CAPACITY_USED = Gauge(
    "gateway_capacity_used",
    "What the worker's live calls take of its capacity: 1 per G.711 call, the Opus and browser costs per such call",
    ["worker"],
    registry=REGISTRY,
)
OPUS_CALLS_AHEAD = Gauge(
    "gateway_opus_calls_encoded_ahead",
    "Opus calls over SIP whose frames are encoded a tick ahead (the tick's encodes over GATEWAY_OPUS_ENCODE_AHEAD_MS)",
    ["worker"],
    registry=REGISTRY,
)
OPUS_ENCODE_MOVES_TOTAL = Counter(
    "gateway_opus_encode_moves_total",
    "Opus SIP calls moved to having their frames encoded a tick ahead (to=ahead) or in their tick (to=inline)",
    ["worker", "to"],
    registry=REGISTRY,
)
CALLS_TOTAL = Counter("gateway_calls_total", "Calls ended, by end reason", ["worker", "end_reason"], registry=REGISTRY)
WARM_TRANSFERS_TOTAL = Counter(
    "gateway_warm_transfers_total",
    "Warm transfers to a human, by outcome: transferred (joined), failed (not reached), declined (by the human, in "
    "a conversational briefing), ended (caller left first)",
    ["worker", "outcome"],
    registry=REGISTRY,
)
CALL_SETUP_SECONDS = Histogram(
    "gateway_call_setup_seconds",
    "INVITE received -> 200 OK sent",
    ["worker"],
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
    registry=REGISTRY,
)
RTP_PACKETS_TOTAL = Counter(
    "gateway_rtp_packets_total", "RTP packets by direction", ["worker", "direction"], registry=REGISTRY
)
RTP_DROPPED_TOTAL = Counter(
    "gateway_rtp_dropped_total", "RTP packets dropped, by reason", ["worker", "reason"], registry=REGISTRY
)
SRTP_DROPPED_TOTAL = Counter(
    "gateway_srtp_dropped_total",
    "SRTP and SRTCP packets refused before they were read, by reason (srtp_auth_failed, srtp_replay, srtp_plaintext, "
    "srtcp_unencrypted, ...; docs/operations.md, SRTP)",
    ["worker", "reason"],
    registry=REGISTRY,
)
RTP_LOST_TOTAL = Counter("gateway_rtp_lost_total", "Inbound RTP packets lost", ["worker"], registry=REGISTRY)
PLAYOUT_EVENTS_TOTAL = Counter(
    "gateway_playout_events_total",
    "Caller audio playout (jitter buffer): frames concealed, frames discarded to cut delay, frames inserted to "
    "grow it, underruns",
    ["worker", "event"],
    registry=REGISTRY,
)
AGENT_AUDIO_GAPS_TOTAL = Counter(
    "gateway_agent_audio_gaps_total",
    "Times a call's agent audio ran out while the item playing was still arriving (a gap the caller heard)",
    ["worker"],
    registry=REGISTRY,
)
RTP_JITTER_MS = Histogram(
    "gateway_rtp_jitter_ms",
    "Inbound interarrival jitter (RFC 3550 A.8) sampled per call",
    ["worker"],
    buckets=(1, 2, 5, 10, 20, 30, 50, 80, 120, 200),
    registry=REGISTRY,
)
SIP_REFERS_TOTAL = Counter(
    "gateway_sip_refers_total",
    "REFERs from peers (transfers of our calls), by outcome: referred, failed (the new call did not answer), "
    "declined (603, the route's policy), invalid (400), busy (491)",
    ["worker", "outcome"],
    registry=REGISTRY,
)
SIP_MESSAGES_TOTAL = Counter(
    "gateway_sip_messages_total", "SIP messages received, by kind", ["worker", "kind"], registry=REGISTRY
)
SIP_REJECTED_TOTAL = Counter(
    "gateway_sip_rejected_total", "SIP input rejected or dropped, by reason", ["worker", "reason"], registry=REGISTRY
)
SIP_BLOCKS_TOTAL = Counter(
    "gateway_sip_blocks_total",
    "Sources (or usernames) blocked after failed SIP authentications (gateway/sip/lockout.py)",
    ["worker"],
    registry=REGISTRY,
)
EARLY_MEDIA_CALLS_TOTAL = Counter(
    "gateway_early_media_calls_total",
    "SIP calls with early media (before the 200 OK): inbound by the route's mode (tone, greeting), outbound received",
    ["worker", "direction", "mode"],
    registry=REGISTRY,
)
EARLY_MEDIA_FRAMES_TOTAL = Counter(
    "gateway_early_media_frames_total",
    "20 ms frames of early media: sent to the far end, or received from it (never passed to the agent)",
    ["worker", "direction"],
    registry=REGISTRY,
)
SIP_CALLS_TOTAL = Counter(
    "gateway_sip_calls_total",
    "SIP calls offered to or placed by the worker, by the transport their INVITE took (udp, tcp, tls) and direction",
    ["worker", "transport", "direction"],
    registry=REGISTRY,
)
SIP_TRANSPORT_MESSAGES_TOTAL = Counter(
    "gateway_sip_transport_messages_total",
    "SIP messages received, by transport (udp, tcp, tls)",
    ["worker", "transport"],
    registry=REGISTRY,
)
SIP_TRANSPORT_ERRORS_TOTAL = Counter(
    "gateway_sip_transport_errors_total",
    "SIP connections refused, closed or failed, by transport (tcp, tls) and reason: refused (over the limit), "
    "closed_oversize, closed_unframeable, closed_idle, closed_backlog, connect_failed, not_tls, handshake_failed, "
    "handshake_timeout, verify_failed, record_error (docs/operations.md, SIP over TLS)",
    ["worker", "transport", "reason"],
    registry=REGISTRY,
)
SIP_CONNECTIONS = Gauge(
    "gateway_sip_connections",
    "Open SIP connections, by transport (tcp, tls)",
    ["worker", "transport"],
    registry=REGISTRY,
)
SIP_TLS_CERTIFICATE_EXPIRY = Gauge(
    "gateway_sip_tls_certificate_expiry_timestamp_seconds",
    "When the SIP TLS certificate served now expires (Unix time); alert well before it",
    ["worker"],
    registry=REGISTRY,
)
PROVIDER_LATENCY_SECONDS = Histogram(
    "gateway_provider_latency_seconds",
    "Caller speech end -> first agent audio sent to the caller",
    ["worker", "provider"],
    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0),
    registry=REGISTRY,
)
CALLER_AUDIO_WAIT_SECONDS = Histogram(
    "gateway_caller_audio_wait_seconds",
    "Gateway-added delay toward the provider: a caller RTP packet's arrival -> its frame handed to the provider "
    "connection (one packet per call per second)",
    ["worker"],
    buckets=(0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5),
    registry=REGISTRY,
)
AGENT_AUDIO_WAIT_SECONDS = Histogram(
    "gateway_agent_audio_wait_seconds",
    "Gateway-added delay toward the caller: a provider item's first audio received -> its first frame sent",
    ["worker", "provider"],
    buckets=(0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5),
    registry=REGISTRY,
)
PROVIDER_RESUMES_TOTAL = Counter(
    "gateway_provider_resumes_total", "Provider reconnects, by outcome", ["worker", "outcome"], registry=REGISTRY
)
BARGE_INS_TOTAL = Counter(
    "gateway_barge_ins_total", "Caller interruptions of agent audio", ["worker"], registry=REGISTRY
)
TOOL_CALLS_TOTAL = Counter(
    "gateway_tool_calls_total", "Tool calls, by tool and outcome", ["worker", "tool", "outcome"], registry=REGISTRY
)
TICK_SECONDS = Histogram(
    "gateway_tick_seconds",
    "Work done in one 20 ms media tick",
    ["worker"],
    # 2 ms apart from 10 to 20 ms: how close a loaded worker's ticks come to the period is its headroom.
    buckets=(0.0005, 0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.012, 0.014, 0.016, 0.018, 0.02, 0.03, 0.04),
    registry=REGISTRY,
)
TICK_OVERRUNS_TOTAL = Counter(
    "gateway_tick_overruns_total",
    "Ticks whose work ended after the next tick's deadline",
    ["worker"],
    registry=REGISTRY,
)
TICKS_SKIPPED_TOTAL = Counter(
    "gateway_ticks_skipped_total",
    "Ticks the media clock skipped after falling more than its catch-up limit behind (a stall); every call's RTP "
    "clock moved on by them",
    ["worker"],
    registry=REGISTRY,
)
GC_PAUSE_SECONDS = Histogram(
    "gateway_gc_pause_seconds",
    "Cyclic garbage collector passes in this process, by generation and by what ran them (tick: paced by the "
    "media clock; other: automatic or explicit)",
    ["generation", "trigger"],
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25),
    registry=REGISTRY,
)
LOOP_LAG_SECONDS = Histogram(
    "gateway_event_loop_lag_seconds",
    "How late the event loop ran a timer",
    ["worker"],
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5),
    registry=REGISTRY,
)
TRUNK_REGISTERED = Gauge(
    "gateway_trunk_registered",
    "1 while the trunk's registrar holds this worker's contact (register = true), else 0",
    ["worker", "trunk"],
    registry=REGISTRY,
)
TRUNK_REGISTER_TOTAL = Counter(
    "gateway_trunk_register_total",
    "REGISTER outcomes with the trunk's registrar: registered, refreshed, contact_missing (a 2xx without our "
    "contact), rejected, auth_rejected, timeout, unregistered, unregister_failed",
    ["worker", "trunk", "outcome"],
    registry=REGISTRY,
)
TRUNK_CALLS_TOTAL = Counter(
    "gateway_trunk_calls_total",
    "SIP calls through a named trunk: inbound ones by the trunk their source belongs to (offers taken), outbound "
    "ones placed through it",
    ["worker", "trunk", "direction"],
    registry=REGISTRY,
)
WORKERS = Gauge("gateway_workers", "Workers known to the control plane, by status", ["status"], registry=REGISTRY)
ADMISSIONS_TOTAL = Counter(
    "gateway_admissions_total",
    "Control-plane admission decisions, by outcome (accepted, over_capacity, no_route, forbidden, no_worker, "
    "application_rejected, application_redirected, application_unavailable)",
    ["outcome"],
    registry=REGISTRY,
)
CALL_HOOK_SECONDS = Histogram(
    "gateway_call_hook_seconds",
    "A route's call-time application asked -> its decision or the fallback, by outcome (accept, reject, redirect, "
    "fallback)",
    ["outcome"],
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 4.0),
    registry=REGISTRY,
)
SSE_CLIENTS = Gauge("gateway_sse_clients", "Open GET /v1/events streams on this process", registry=REGISTRY)


class _Family(Collector):
    """One collected metric family, as the collector ``generate_latest`` formats."""

    def __init__(self, family: Metric) -> None:
        self._family = family

    def collect(self) -> Iterable[Metric]:
        return (self._family,)


async def exposition(registry: Collector = REGISTRY, *, slice_s: float = SLICE_S) -> bytes:
    """``generate_latest(registry)``, byte for byte, without holding the event loop for more than about
    ``slice_s`` plus one family at a time.

    Each family is collected and formatted by prometheus-client itself; between families, once ``slice_s``
    has passed, the loop runs what is due (a media tick first: uvloop runs due timers before ready callbacks).
    A family's samples are read together, so each is consistent in itself, as in one ``generate_latest``;
    families are read moments apart, as two scrapes would be."""
    parts: list[bytes] = []
    slices = Slices(slice_s)
    for family in registry.collect():
        parts.append(generate_latest(_Family(family)))
        await slices.next()
    return b"".join(parts)


DB_WRITE_BACKLOG = Gauge(
    "gateway_db_write_backlog",
    "Ended calls waiting to be written to the database of calls (bounded: GATEWAY_DB_WRITE_BACKLOG)",
    registry=REGISTRY,
)
DB_WRITE_FAILURES_TOTAL = Counter(
    "gateway_db_write_failures_total",
    "Failed writes of call records (the batch is kept and retried with backoff)",
    registry=REGISTRY,
)
DB_RECORDS_WRITTEN_TOTAL = Counter(
    "gateway_db_records_written_total", "Call records written to the database of calls", registry=REGISTRY
)
DB_RECORDS_DROPPED_TOTAL = Counter(
    "gateway_db_records_dropped_total",
    "Call records dropped unwritten because the write backlog was full (the oldest goes)",
    registry=REGISTRY,
)
DB_RECORDS_EXPIRED_TOTAL = Counter(
    "gateway_db_records_expired_total", "Call records deleted by retention (GATEWAY_RETENTION_DAYS)", registry=REGISTRY
)
RECORDING_TICKS_DROPPED_TOTAL = Counter(
    "gateway_recording_ticks_dropped_total",
    "Ticks of recorded calls the recordings writer's queue was too full to take (written as silence)",
    ["worker"],
    registry=REGISTRY,
)
RECORDINGS_TOTAL = Counter(
    "gateway_recordings_total",
    "Recordings finished, by outcome (written, failed)",
    ["worker", "outcome"],
    registry=REGISTRY,
)

WEBHOOK_PENDING = Gauge(
    "gateway_webhook_pending",
    "Event webhook deliveries waiting in the outbox (pending: not yet delivered, attempts left)",
    registry=REGISTRY,
)
WEBHOOK_DELIVERED_TOTAL = Counter(
    "gateway_webhook_delivered_total", "Event webhook deliveries the receiver took (2xx)", registry=REGISTRY
)
WEBHOOK_FAILED_TOTAL = Counter(
    "gateway_webhook_failed_total",
    "Event webhook deliveries given up after GATEWAY_EVENT_WEBHOOK_MAX_ATTEMPTS (a manual redeliver retries them)",
    registry=REGISTRY,
)
WEBHOOK_ATTEMPTS_TOTAL = Counter(
    "gateway_webhook_attempts_total",
    "Event webhook delivery attempts by outcome (ok: 2xx; http_error: another status; unreachable: no answer)",
    ["outcome"],
    registry=REGISTRY,
)
WEBHOOK_EVENTS_DROPPED_TOTAL = Counter(
    "gateway_webhook_events_dropped_total",
    "Live webhook events dropped before the outbox because its buffer was full (the database was down long)",
    registry=REGISTRY,
)
