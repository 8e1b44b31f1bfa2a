"""The tables of the database of calls (SQLAlchemy Core), as the newest migration leaves them.

Times are Unix epoch seconds (double precision), as everywhere in the fleet contract. A call's transcript items
and tool calls are rows of their own, keyed by (call id, position), deleted with their call. ``context`` holds
the caller context as JSON; ``recording_path`` is where its recording lies (relative to the
recordings directory) and ``recording`` describes it (JSON: the fleet contract's RecordingModel); both null for a
call not recorded. Migrations under ``migrations/versions`` build this; a test checks
that the two agree.
"""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

calls = sa.Table(
    "calls",
    metadata,
    sa.Column("id", sa.String(128), primary_key=True),
    sa.Column("direction", sa.String(16), nullable=False),
    sa.Column("kind", sa.String(16), nullable=False),
    sa.Column("from_number", sa.String(256), nullable=False),
    sa.Column("to_number", sa.String(256), nullable=False),
    sa.Column("route", sa.String(128), nullable=False),
    sa.Column("profile", sa.String(128), nullable=False),
    sa.Column("provider", sa.String(64), nullable=False),
    sa.Column("worker", sa.String(128), nullable=False),
    sa.Column("context", sa.JSON, nullable=True),
    sa.Column("started_at", sa.Double, nullable=False),
    sa.Column("answered_at", sa.Double, nullable=True),
    sa.Column("ended_at", sa.Double, nullable=False),
    sa.Column("duration_s", sa.Double, nullable=False),
    sa.Column("end_reason", sa.String(64), nullable=False),
    sa.Column("codec", sa.String(32), nullable=False),
    sa.Column("transport", sa.String(8), nullable=False),
    sa.Column("srtp", sa.String(64), nullable=False),
    sa.Column("cost", sa.Double, nullable=False),
    sa.Column("mos", sa.Double, nullable=True),
    sa.Column("jitter_ms", sa.Double, nullable=False),
    sa.Column("loss_pct", sa.Double, nullable=False),
    sa.Column("concealed", sa.Integer, nullable=False),
    sa.Column("provider_latency_p50_ms", sa.Double, nullable=True),
    sa.Column("provider_latency_last_ms", sa.Double, nullable=True),
    sa.Column("barge_ins", sa.Integer, nullable=False),
    sa.Column("resumes", sa.Integer, nullable=False),
    sa.Column("tool_call_count", sa.Integer, nullable=False),
    sa.Column("stats", sa.JSON, nullable=False),
    sa.Column("dtmf", sa.String(256), nullable=False),
    sa.Column("recording_path", sa.String(1024), nullable=True),
    sa.Column("written_at", sa.Double, nullable=False),
    sa.Column("trace_id", sa.String(32), nullable=False, server_default=""),
    sa.Column("handoffs", sa.Integer, nullable=False, server_default="0"),
    sa.Column("dtmf_events", sa.JSON, nullable=True),  # [{digit, direction: received|sent, at_s}] in call order
    sa.Column("recording", sa.JSON, nullable=True),
    sa.Column("handoff_log", sa.JSON, nullable=True),  # [{at_s, from_profile, to_profile, ...}]
    sa.Column("amd", sa.JSON, nullable=True),  # outbound answering-machine detection: {result, reason, at_s, beep_at_s}
    sa.Column("referrals", sa.JSON, nullable=True),  # the peer's REFERs: [{at_s, target, replaces, outcome, status}]
    sa.Column("transfer", sa.JSON, nullable=True),  # warm transfer: {id, caller_leg, human_leg, state, outcome, ...}
    sa.Column("trunk", sa.String(64), nullable=True),  # the trunk it came in on or went out through (null: none)
    sa.Index("ix_calls_started_at", "started_at", "id"),
    sa.Index("ix_calls_ended_at", "ended_at"),
    sa.Index("ix_calls_from_number", "from_number"),
    sa.Index("ix_calls_to_number", "to_number"),
    sa.Index("ix_calls_trunk", "trunk", "started_at"),
)

transcript_items = sa.Table(
    "transcript_items",
    metadata,
    sa.Column("call_id", sa.String(128), sa.ForeignKey("calls.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("role", sa.String(16), nullable=False),
    sa.Column("text", sa.Text, nullable=False),
    sa.Column("start_s", sa.Double, nullable=True),
    sa.Column("end_s", sa.Double, nullable=True),
    sa.Column("truncated", sa.Boolean, nullable=False),
)

tool_calls = sa.Table(
    "tool_calls",
    metadata,
    sa.Column("call_id", sa.String(128), sa.ForeignKey("calls.id", ondelete="CASCADE"), primary_key=True),
    sa.Column("seq", sa.Integer, primary_key=True),
    sa.Column("name", sa.String(64), nullable=False),
    sa.Column("arguments", sa.Text, nullable=False),
    sa.Column("result", sa.Text, nullable=False),
    sa.Column("start_s", sa.Double, nullable=True),
    sa.Column("duration_ms", sa.Double, nullable=True),
)

# The event webhooks' outbox (gateway/records/outbox.py): one row per event and endpoint, delivered in id order
# per (endpoint, call); (endpoint, call_id, dedupe_key) is unique so an event offered twice is kept once.
webhook_outbox = sa.Table(
    "webhook_outbox",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True, autoincrement=True),
    sa.Column("msg_id", sa.String(64), nullable=False, unique=True),
    sa.Column("endpoint", sa.String(64), nullable=False),
    sa.Column("call_id", sa.String(128), nullable=False),
    sa.Column("event_type", sa.String(64), nullable=False),
    sa.Column("dedupe_key", sa.String(192), nullable=False),
    sa.Column("body", sa.Text, nullable=False),
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("attempts", sa.Integer, nullable=False),
    sa.Column("created_at", sa.Double, nullable=False),
    sa.Column("next_attempt_at", sa.Double, nullable=True),
    sa.Column("last_attempt_at", sa.Double, nullable=True),
    sa.Column("delivered_at", sa.Double, nullable=True),
    sa.Column("last_status_code", sa.Integer, nullable=True),
    sa.Column("last_error", sa.String(512), nullable=False),
    sa.UniqueConstraint("endpoint", "call_id", "dedupe_key", name="uq_webhook_outbox_event"),
    sa.Index("ix_webhook_outbox_due", "status", "next_attempt_at"),
    sa.Index("ix_webhook_outbox_stream", "endpoint", "call_id", "status", "id"),
)
