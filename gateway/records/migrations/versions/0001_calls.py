"""The calls table: one row per ended call.

Revision ID: 0001_calls
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_calls"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "calls",
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
    )
    op.create_index("ix_calls_started_at", "calls", ["started_at", "id"])
    op.create_index("ix_calls_ended_at", "calls", ["ended_at"])
    op.create_index("ix_calls_from_number", "calls", ["from_number"])
    op.create_index("ix_calls_to_number", "calls", ["to_number"])


def downgrade() -> None:
    op.drop_table("calls")
